// getaddrinfo() without NSS, for the static builds, over c-ares (Debian's libc-ares-dev, linked
// from its archive): address literals as they are, then the hosts file, then DNS to the
// nameservers of resolv.conf (`search`/`domain`, `options ndots: timeout: attempts:`), over UDP
// and, for a truncated answer, TCP.
//
// Why: a statically linked glibc program's getaddrinfo() loads the NSS modules of the glibc it
// was linked with at run time; on another distribution or in a chroot those are missing or
// different. The static ddprun/ddpstore (DDPRUN_STATIC, cmake/DdprunStatic.cmake) route every
// getaddrinfo() call here (static_link_wraps.cpp); dynamic builds keep the system resolver.
// c-ares parses what comes off the network; ours only drives it (cares_resolver.cpp) and builds
// the list (addr_info.cpp).
//
// Results list IPv4 addresses before IPv6 (no RFC 6724 sorting). Blocking; any thread: each
// call reads the configuration afresh (it changes under long-running programs) into a c-ares
// channel of its own.
#pragma once

#include <netdb.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::sys::cares {

// resolv.conf's `options timeout:N attempts:N` (the last of each wins), capped as glibc caps
// them (1..30 s, 1..5), glibc's 5 s and 2 where it says nothing. c-ares 1.18 reads neither and
// would make 4 tries, each round waiting twice as long as the one before.
struct RetryLimits {
  std::chrono::milliseconds timeout{5000};  // the first round's, per server
  int attempts = 2;                         // rounds over all the servers
};
RetryLimits parse_resolv_options(std::string_view resolv_conf);

// Where the configuration comes from; the defaults are the system's. Tests point them at files
// and DNS servers of their own.
struct Options {
  std::string resolv_conf = "/etc/resolv.conf";
  // When not empty, replaces resolv.conf's nameservers, ports allowed: "127.0.0.1:5300,[::1]:53".
  std::string servers;
  // Replaces `options timeout:`, which counts whole seconds.
  std::optional<std::chrono::milliseconds> timeout;
  // The hosts file is $CARES_HOSTS (when set) instead of /etc/hosts: c-ares 1.18 takes no path.
  bool hosts_from_env = false;
};

// getaddrinfo(): AI_PASSIVE, AI_CANONNAME, AI_NUMERICHOST, AI_NUMERICSERV and AI_V4MAPPED are
// honoured, AI_ADDRCONFIG is ignored; services must be numeric (no /etc/services: EAI_SERVICE).
// Literals keep an IPv6 scope ("fe80::1%eth0"). "localhost" and its subdomains are loopback when
// the hosts file does not name them, and never asked of DNS. Errors: EAI_NONAME (no such name,
// or none of the family asked), EAI_AGAIN (no server answered, or they failed), EAI_FAMILY,
// EAI_SOCKTYPE, EAI_SERVICE, EAI_ADDRFAMILY (a literal of the other family), EAI_MEMORY,
// EAI_FAIL. Results must be freed with free_addr_info().
int get_addr_info(const char* node, const char* service, const addrinfo* hints, addrinfo** res,
                  const Options& options = {});
void free_addr_info(addrinfo* ai);

}  // namespace ddprun::sys::cares
