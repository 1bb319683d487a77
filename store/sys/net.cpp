#include "store/sys/net.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>
#include <set>

#include "store/sys/log.hpp"

namespace ddprun::sys {
namespace {

// Numeric form of an IPv4/IPv6 socket address ("10.0.0.1", "fe80::1").
std::string numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

std::set<std::string> numeric_addresses(const std::string& host) {
  std::string error;
  std::set<std::string> out;
  for (const auto& a : resolve(host, 0, false, &error)) {
    out.insert(numeric(reinterpret_cast<const sockaddr*>(&a.addr)));
  }
  return out;
}

}  // namespace

std::string endpoint_text(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

bool is_address_literal(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  return ::inet_pton(AF_INET, host.c_str(), &v4) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

bool is_wildcard(const std::string& host) {
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return v4.s_addr == INADDR_ANY;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_UNSPECIFIED(&v6);
  return false;
}

std::vector<ResolvedAddress> resolve(const std::string& host, uint16_t port, bool passive,
                                     std::string* error, std::string* canonical) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = (passive ? AI_PASSIVE : 0) | (canonical ? AI_CANONNAME : 0);
  if (is_address_literal(host)) hints.ai_flags |= AI_NUMERICHOST;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &result);
  std::vector<ResolvedAddress> out;
  if (rc != 0) {
    *error = std::string("cannot resolve host: ") + gai_strerror(rc);
    return out;
  }
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    if (canonical && ai->ai_canonname && canonical->empty()) *canonical = ai->ai_canonname;
    ResolvedAddress a;
    std::memcpy(&a.addr, ai->ai_addr, ai->ai_addrlen);
    a.len = ai->ai_addrlen;
    a.family = ai->ai_family;
    out.push_back(a);
  }
  ::freeaddrinfo(result);
  return out;
}

std::string fq_host_name() {
  static const std::string name = [] {
    std::string canonical, error;
    resolve(host_name(), 0, false, &error, &canonical);
    return canonical.empty() || canonical == "localhost" ? host_name() : canonical;
  }();
  return name;
}

bool names_this_machine(const std::string& host) {
  if (is_loopback(host)) return true;
  if (host == host_name() || host == fq_host_name()) return true;
  std::set<std::string> wanted = numeric_addresses(host);
  if (wanted.empty()) return false;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return false;
  bool found = false;
  for (ifaddrs* i = ifs; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6) continue;
    found = wanted.count(numeric(i->ifa_addr)) > 0;
  }
  ::freeifaddrs(ifs);
  return found;
}

}  // namespace ddprun::sys
