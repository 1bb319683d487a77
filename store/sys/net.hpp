// Host names, addresses and endpoints: the one place ddprun resolves a name, formats
// "host:port" and decides whether an address is loopback or names this machine.
//
// Resolving goes through the system resolver (in the static builds, an NSS-free one over
// c-ares: cares_resolver.hpp), which may wait on DNS: callers resolve only names they must (an
// address literal is never looked up).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::sys {

// "host:port", with brackets around an IPv6 literal: "[::1]:29400".
std::string endpoint_text(const std::string& host, int port);

// Whether `host` is a numeric IPv4 or IPv6 address (no lookup).
bool is_address_literal(const std::string& host);

// The one loopback rule: "localhost", 127.0.0.0/8 or ::1. No lookup.
bool is_loopback(const std::string& host);

// Whether `host` is a wildcard address ("0.0.0.0", "::").
bool is_wildcard(const std::string& host);

// The addresses of host:port (numeric hosts are not looked up). `passive` asks for addresses
// to bind. On failure returns none and sets *error ("cannot resolve host: ...").
struct ResolvedAddress {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = 0;
};
std::vector<ResolvedAddress> resolve(const std::string& host, uint16_t port, bool passive,
                                     std::string* error, std::string* canonical = nullptr);

// The fully qualified host name (canonical name of gethostname()), like Python's
// socket.getfqdn(); the short name when it does not resolve. Cached.
std::string fq_host_name();

// Whether `host` names this machine: loopback, the host name or its FQDN, or a name/address
// of one of this machine's interfaces. May return false for aliases it cannot see.
bool names_this_machine(const std::string& host);

}  // namespace ddprun::sys
