// A host name resolver that needs no NSS: address literals as they are, then the hosts file,
// then DNS over UDP to the nameservers of resolv.conf (A and AAAA, `search`/`domain` and
// `options ndots: timeout: attempts:`). No TCP fallback: a truncated answer is used as far as
// it goes.
//
// Why: a statically linked glibc program's getaddrinfo() loads the NSS modules of the glibc it
// was linked with at run time; on another distribution or in a chroot those are missing or
// different. The static ddprun/ddpstore (DDPRUN_STATIC, cmake/DdprunStatic.cmake) route every
// getaddrinfo() call here (static_link_wraps.cpp); dynamic builds keep the system resolver.
//
// Results list IPv4 addresses before IPv6 (no RFC 6724 sorting). Blocking; any thread.
#pragma once

#include <netdb.h>
#include <sys/socket.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "store/sys/dns_message.hpp"

namespace ddprun::sys::dns {

struct Nameserver {
  sockaddr_storage addr{};
  socklen_t len = 0;
};

struct Config {
  std::vector<Nameserver> nameservers;  // at most 3, as glibc; none: 127.0.0.1:53
  std::vector<std::string> search;      // domains tried for names with fewer than ndots dots
  int ndots = 1;
  std::chrono::milliseconds timeout{5000};  // per server and attempt
  int attempts = 2;
  std::string hosts_path = "/etc/hosts";
};

// Parses resolv.conf text: `nameserver`, `search`/`domain` (the last one wins) and
// `options ndots:N timeout:N attempts:N`, capped as glibc caps them. Unknown lines are ignored.
Config parse_resolv_conf(std::string_view text);

// /etc/resolv.conf, read on every call (it changes under long-running programs); without a
// search line, the domain of this machine's host name is searched, as glibc does.
Config system_config();

// The address of a numeric host ("10.0.0.1", "fe80::1%eth0"), with its IPv6 scope id.
struct Literal {
  Address address;
  uint32_t scope_id = 0;
};
std::optional<Literal> parse_literal(const std::string& host);

struct Lookup {
  std::vector<Address> addresses;
  std::string canonical;  // the hosts file's first name or DNS's owner name
  int error = 0;          // 0, EAI_NONAME (no such name) or EAI_AGAIN (no server answered)
};

// The addresses of `name` in the hosts file at `path` (every matching line; case-insensitive).
// `family`: AF_UNSPEC, AF_INET or AF_INET6.
Lookup lookup_hosts(const std::string& path, const std::string& name, int family);

// The addresses of `name` (not a literal): hosts file, then DNS; "localhost" and its
// subdomains are loopback when the hosts file does not name them.
Lookup lookup(const std::string& name, int family, const Config& config);

// getaddrinfo() over lookup(): AI_PASSIVE, AI_CANONNAME, AI_NUMERICHOST, AI_NUMERICSERV and
// AI_V4MAPPED are honoured, AI_ADDRCONFIG is ignored; services must be numeric (no
// /etc/services). Results must be freed with free_addr_info().
int get_addr_info(const char* node, const char* service, const addrinfo* hints, addrinfo** res,
                  const Config& config);
void free_addr_info(addrinfo* ai);

}  // namespace ddprun::sys::dns
