// The getaddrinfo() contract of the static builds' resolver (cares_resolver.hpp), without
// c-ares: the arguments checked, numeric services, no node (the wildcard or loopback), address
// literals (an IPv6 scope kept), AI_V4MAPPED, and the list get_addr_info() returns and
// free_addr_info() frees. Names go to lookup() (cares_resolver.cpp).
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "store/sys/cares_resolver.hpp"
#include "store/sys/cares_resolver_internal.hpp"

namespace ddprun::sys::cares {
namespace detail {

Address loopback(int family) {
  Address a{family, {}, 0};
  if (family == AF_INET) {
    a.bytes[0] = 127;
    a.bytes[3] = 1;
  } else {
    a.bytes[15] = 1;
  }
  return a;
}

}  // namespace detail
namespace {

using detail::Address;
using detail::Lookup;
using detail::loopback;

// The address of a numeric host ("10.0.0.1", "fe80::1%eth0"). Ours rather than c-ares's:
// c-ares 1.18 knows no scope ids.
std::optional<Address> parse_literal(const std::string& host) {
  Address a;
  if (::inet_pton(AF_INET, host.c_str(), a.bytes.data()) == 1) {
    a.family = AF_INET;
    return a;
  }
  const size_t pct = host.find('%');
  if (::inet_pton(AF_INET6, host.substr(0, pct).c_str(), a.bytes.data()) != 1) return std::nullopt;
  a.family = AF_INET6;
  if (pct != std::string::npos) {
    const std::string scope = host.substr(pct + 1);
    a.scope_id = ::if_nametoindex(scope.c_str());
    if (a.scope_id == 0) {
      char* end = nullptr;
      unsigned long n = std::strtoul(scope.c_str(), &end, 10);
      if (scope.empty() || *end != '\0') return std::nullopt;
      a.scope_id = static_cast<uint32_t>(n);
    }
  }
  return a;
}

Address v4_mapped(const Address& a) {
  Address m{AF_INET6, {}, 0};
  m.bytes[10] = m.bytes[11] = 0xff;
  std::memcpy(m.bytes.data() + 12, a.bytes.data(), 4);
  return m;
}

// The addresses `node` names, or an EAI_ error.
int addresses_of(const char* node, const addrinfo& hints, const Options& options,
                 std::vector<Address>* out, std::string* canonical) {
  const int family = hints.ai_family;
  if (node == nullptr) {  // the wildcard to bind, or loopback to connect
    const bool passive = (hints.ai_flags & AI_PASSIVE) != 0;
    if (family != AF_INET6) out->push_back(passive ? Address{AF_INET, {}, 0} : loopback(AF_INET));
    if (family != AF_INET) out->push_back(passive ? Address{AF_INET6, {}, 0} : loopback(AF_INET6));
    return 0;
  }
  if (auto literal = parse_literal(node)) {
    if (family == AF_INET6 && literal->family == AF_INET && (hints.ai_flags & AI_V4MAPPED)) {
      literal = v4_mapped(*literal);
    }
    if (family != AF_UNSPEC && family != literal->family) return EAI_ADDRFAMILY;
    out->push_back(*literal);
    *canonical = node;
    return 0;
  }
  if (hints.ai_flags & AI_NUMERICHOST) return EAI_NONAME;
  // AI_V4MAPPED: IPv6 addresses if the name has any, else its IPv4 ones mapped (no AI_ALL).
  const bool map = family == AF_INET6 && (hints.ai_flags & AI_V4MAPPED);
  Lookup found = detail::lookup(node, map ? AF_UNSPEC : family, options);
  if (found.error != 0) return found.error;
  const bool any_v6 = std::any_of(found.addresses.begin(), found.addresses.end(),
                                  [](const Address& a) { return a.family == AF_INET6; });
  for (const Address& a : found.addresses) {
    if (!map || a.family == AF_INET6) {
      out->push_back(a);
    } else if (!any_v6) {
      out->push_back(v4_mapped(a));
    }
  }
  *canonical = found.canonical;
  return out->empty() ? EAI_NONAME : 0;
}

// One result: the addrinfo and the socket address it points at, freed together.
struct Node {
  addrinfo ai{};
  sockaddr_storage addr{};
};

struct SocketKind {
  int socktype;
  int protocol;
};

std::vector<SocketKind> socket_kinds(const addrinfo& hints) {
  std::vector<SocketKind> out;
  if (hints.ai_socktype == 0 || hints.ai_socktype == SOCK_STREAM) {
    out.push_back({SOCK_STREAM, IPPROTO_TCP});
  }
  if (hints.ai_socktype == 0 || hints.ai_socktype == SOCK_DGRAM) {
    out.push_back({SOCK_DGRAM, IPPROTO_UDP});
  }
  for (SocketKind& k : out) {
    if (hints.ai_protocol != 0) k.protocol = hints.ai_protocol;
  }
  return out;
}

// Points `n`'s addrinfo at its own socket address: `a` and `port`.
void set_address(Node* n, const Address& a, uint16_t port) {
  n->ai.ai_family = a.family;
  n->ai.ai_addr = reinterpret_cast<sockaddr*>(&n->addr);
  if (a.family == AF_INET) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&n->addr);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    std::memcpy(&sin->sin_addr, a.bytes.data(), 4);
    n->ai.ai_addrlen = sizeof(sockaddr_in);
  } else {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&n->addr);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(port);
    std::memcpy(&sin6->sin6_addr, a.bytes.data(), 16);
    sin6->sin6_scope_id = a.scope_id;
    n->ai.ai_addrlen = sizeof(sockaddr_in6);
  }
}

// The list get_addr_info() returns into `*res`: an entry per address and socket kind, in that
// order, `canonical` (when not empty) on the first.
void make_list(const std::vector<Address>& addresses, const std::vector<SocketKind>& kinds,
               uint16_t port, const std::string& canonical, addrinfo** res) {
  addrinfo** tail = res;
  for (const Address& a : addresses) {
    for (const SocketKind& k : kinds) {
      auto* n = new Node;
      set_address(n, a, port);
      n->ai.ai_socktype = k.socktype;
      n->ai.ai_protocol = k.protocol;
      if (tail == res && !canonical.empty()) n->ai.ai_canonname = ::strdup(canonical.c_str());
      *tail = &n->ai;
      tail = &n->ai.ai_next;
    }
  }
}

}  // namespace

int get_addr_info(const char* node, const char* service, const addrinfo* hints_in, addrinfo** res,
                  const Options& options) {
  *res = nullptr;
  addrinfo hints{};
  if (hints_in) {
    hints = *hints_in;
  } else {
    hints.ai_flags = AI_V4MAPPED | AI_ADDRCONFIG;
  }
  if (node == nullptr && service == nullptr) return EAI_NONAME;
  if (hints.ai_family != AF_UNSPEC && hints.ai_family != AF_INET && hints.ai_family != AF_INET6) {
    return EAI_FAMILY;
  }
  const std::vector<SocketKind> kinds = socket_kinds(hints);
  if (kinds.empty()) return EAI_SOCKTYPE;
  uint16_t port = 0;
  if (service != nullptr && *service != '\0') {
    char* end = nullptr;
    errno = 0;
    unsigned long n = std::strtoul(service, &end, 10);
    if (*end != '\0' || errno != 0 || n > 65535) return EAI_SERVICE;  // no /etc/services
    port = static_cast<uint16_t>(n);
  }
  std::vector<Address> addresses;
  std::string canonical;
  if (int rc = addresses_of(node, hints, options, &addresses, &canonical); rc != 0) return rc;
  if (!(hints.ai_flags & AI_CANONNAME)) canonical.clear();
  make_list(addresses, kinds, port, canonical, res);
  return 0;
}

void free_addr_info(addrinfo* ai) {
  while (ai != nullptr) {
    addrinfo* next = ai->ai_next;
    std::free(ai->ai_canonname);
    delete reinterpret_cast<Node*>(ai);  // ai is the first member of its Node
    ai = next;
  }
}

}  // namespace ddprun::sys::cares
