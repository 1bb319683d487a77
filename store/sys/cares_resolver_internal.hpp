// Internal to store/sys: what the two halves of the static builds' resolver share, and nothing
// outside them includes. addr_info.cpp holds the getaddrinfo() contract (arguments, literals,
// the result list) and needs no c-ares; cares_resolver.cpp looks names up over c-ares.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "store/sys/cares_resolver.hpp"

namespace ddprun::sys::cares::detail {

// An IPv4 (4 bytes used) or IPv6 address in network byte order, with its IPv6 scope.
struct Address {
  int family = 0;  // AF_INET or AF_INET6
  std::array<unsigned char, 16> bytes{};
  uint32_t scope_id = 0;
  friend bool operator==(const Address&, const Address&) = default;
};

// 127.0.0.1 or ::1 (addr_info.cpp).
Address loopback(int family);

// What lookup() found: the addresses, each once, IPv4 first, and the canonical name; or an EAI_
// error.
struct Lookup {
  int error = 0;
  std::vector<Address> addresses;
  std::string canonical;
};

// The addresses of `name` (not a literal): the hosts file, then DNS (cares_resolver.cpp).
Lookup lookup(const std::string& name, int family, const Options& options);

}  // namespace ddprun::sys::cares::detail
