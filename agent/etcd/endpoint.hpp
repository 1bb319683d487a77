// An etcd member's client address, as --rdzv-endpoint lists them: parsed once by the launcher
// and carried typed from there (agent/rendezvous/settings.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::etcd {

constexpr uint16_t kDefaultPort = 2379;

struct Endpoint {
  std::string host;  // a name or an address literal (no brackets)
  uint16_t port = kDefaultPort;
};

// "h1:2379, h2:2379" (brackets around IPv6 literals).
std::string endpoints_text(const std::vector<Endpoint>& endpoints);
// Parses "HOST[:PORT][,HOST[:PORT]...]" (default port 2379; IPv6 as [::1]:2379; torchrun's
// http:// and https:// prefixes accepted). Throws std::invalid_argument naming the bad part.
std::vector<Endpoint> parse_endpoints(const std::string& text);

}  // namespace ddprun::etcd
