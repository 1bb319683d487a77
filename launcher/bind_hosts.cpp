#include "launcher/bind_hosts.hpp"

#include "store/sys/net.hpp"

namespace ddprun::launcher {

bool is_ipv6_literal(const std::string& host) {
  return host.find(':') != std::string::npos && sys::is_address_literal(host);
}

std::string wildcard_address(bool ipv6) {
  return ipv6 ? "::" : "0.0.0.0";
}

std::string bind_address(const std::string& host, bool ipv6) {
  if (sys::is_address_literal(host) && !sys::is_wildcard(host)) return host;
  return wildcard_address(ipv6);
}

}  // namespace ddprun::launcher
