#include "agent/rendezvous/workers_store_peers.hpp"

#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

#include "store/sys/net.hpp"

namespace ddprun::agent {
namespace {

namespace ip = boost::asio::ip;

ip::address to_address(const sys::ResolvedAddress& r) {
  if (r.family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&r.addr);
    ip::address_v4::bytes_type b;
    std::memcpy(b.data(), &in->sin_addr, b.size());
    return ip::address_v4(b);
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&r.addr);
  ip::address_v6::bytes_type b;
  std::memcpy(b.data(), &in6->sin6_addr, b.size());
  return ip::address_v6(b, in6->sin6_scope_id);
}

void add(std::vector<ip::address>& out, const ip::address& a) {
  if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
}

}  // namespace

std::vector<ip::address> loopback_peers() {
  return {ip::address_v4::loopback(), ip::address_v6::loopback()};
}

std::vector<ip::address> member_peers(const std::vector<std::string>& members,
                                      std::vector<std::string>* unresolved) {
  std::vector<ip::address> out = loopback_peers();
  for (const std::string& member : members) {
    std::string error;
    std::vector<sys::ResolvedAddress> addrs = sys::resolve(member, 0, false, &error);
    if (addrs.empty()) unresolved->push_back(member);
    for (const sys::ResolvedAddress& r : addrs) {
      if (r.family == AF_INET || r.family == AF_INET6) add(out, to_address(r));
    }
  }
  return out;
}

std::vector<ip::address> this_machine_peers() {
  std::vector<ip::address> out = loopback_peers();
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    sys::ResolvedAddress r;
    r.family = family;
    r.len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&r.addr, i->ifa_addr, r.len);
    add(out, to_address(r));
  }
  ::freeifaddrs(ifs);
  return out;
}

}  // namespace ddprun::agent
