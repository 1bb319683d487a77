#include "agent/etcd/endpoint.hpp"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "store/sys/net.hpp"

namespace ddprun::etcd {

std::string endpoints_text(const std::vector<Endpoint>& endpoints) {
  std::string out;
  for (const auto& e : endpoints) {
    if (!out.empty()) out += ", ";
    out += sys::endpoint_text(e.host, e.port);
  }
  return out;
}

std::vector<Endpoint> parse_endpoints(const std::string& text) {
  std::vector<Endpoint> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string part =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    // torchrun's etcd spellings carry a scheme: accept and drop it.
    for (const char* scheme : {"http://", "https://"}) {
      if (part.rfind(scheme, 0) == 0) part.erase(0, std::string(scheme).size());
    }
    while (!part.empty() && part.back() == '/') part.pop_back();
    if (part.empty()) throw std::invalid_argument("an empty endpoint in '" + text + "'");
    Endpoint e;
    std::string port_text;
    if (part.front() == '[') {
      size_t close = part.find(']');
      if (close == std::string::npos) throw std::invalid_argument("'" + part + "': missing ']'");
      e.host = part.substr(1, close - 1);
      if (close + 1 < part.size()) {
        if (part[close + 1] != ':') throw std::invalid_argument("'" + part + "': expected ]:PORT");
        port_text = part.substr(close + 2);
      }
    } else if (std::count(part.begin(), part.end(), ':') > 1) {
      e.host = part;  // a bare IPv6 literal
    } else if (size_t colon = part.find(':'); colon != std::string::npos) {
      e.host = part.substr(0, colon);
      port_text = part.substr(colon + 1);
    } else {
      e.host = part;
    }
    if (e.host.empty()) throw std::invalid_argument("'" + part + "': no host");
    if (!port_text.empty() || part.back() == ':') {
      char* end = nullptr;
      long p = std::strtol(port_text.c_str(), &end, 10);
      if (port_text.empty() || *end != '\0' || p < 1 || p > 65535) {
        throw std::invalid_argument("'" + part + "': the port must be 1 to 65535");
      }
      e.port = static_cast<uint16_t>(p);
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace ddprun::etcd
