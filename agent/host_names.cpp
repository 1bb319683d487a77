#include "agent/host_names.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <set>

#include "agent/log.hpp"

namespace ddprun::agent {
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

std::set<std::string> resolve(const std::string& host, std::string* canonical) {
  std::set<std::string> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_CANONNAME;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    if (canonical && ai->ai_canonname && canonical->empty()) *canonical = ai->ai_canonname;
    out.insert(numeric(ai->ai_addr));
  }
  ::freeaddrinfo(res);
  return out;
}

bool is_loopback(const std::string& host) {
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

}  // namespace

std::string fq_host_name() {
  static const std::string name = [] {
    std::string canonical;
    resolve(host_name(), &canonical);
    return canonical.empty() || canonical == "localhost" ? host_name() : canonical;
  }();
  return name;
}

bool names_this_machine(const std::string& host) {
  if (host == "localhost" || is_loopback(host)) return true;
  if (host == host_name() || host == fq_host_name()) return true;
  std::set<std::string> wanted = resolve(host, nullptr);
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

}  // namespace ddprun::agent
