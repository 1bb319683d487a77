// Where the stores the agent hosts listen. A store listens on the address the user named when
// that is an address literal, so a job told to use 127.0.0.1 or ::1 is not reachable from
// other machines; a host name gets the wildcard of its family instead, because resolving it
// here would add a DNS wait (and a guess among its addresses) to every launch.
#pragma once

#include <string>

namespace ddprun::launcher {

// A numeric IPv6 address ("::1", "fe80::1"), no brackets. No lookup.
bool is_ipv6_literal(const std::string& host);

// "::" when `ipv6`, else "0.0.0.0".
std::string wildcard_address(bool ipv6);

// `host` when it is an address literal other than a wildcard; else wildcard_address(ipv6).
std::string bind_address(const std::string& host, bool ipv6);

}  // namespace ddprun::launcher
