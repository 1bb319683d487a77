// getaddrinfo() semantics over dns::lookup() (see dns_resolver.hpp).
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "store/sys/dns_resolver.hpp"

namespace ddprun::sys::dns {
namespace {

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

Address v4_mapped(const Address& a) {
  Address m{AF_INET6, {}};
  m.bytes[10] = m.bytes[11] = 0xff;
  std::memcpy(m.bytes.data() + 12, a.bytes.data(), 4);
  return m;
}

// The addresses node names, or an EAI_ error.
int addresses_of(const char* node, const addrinfo& hints, const Config& config,
                 std::vector<Address>* out, uint32_t* scope_id, std::string* canonical) {
  const int family = hints.ai_family;
  if (node == nullptr) {  // the wildcard to bind, or loopback to connect
    bool passive = (hints.ai_flags & AI_PASSIVE) != 0;
    Address v4{AF_INET, {}};
    if (!passive) v4.bytes = {127, 0, 0, 1};
    Address v6{AF_INET6, {}};
    if (!passive) v6.bytes[15] = 1;
    if (family != AF_INET6) out->push_back(v4);
    if (family != AF_INET) out->push_back(v6);
    return 0;
  }
  if (auto literal = parse_literal(node)) {
    if (family == AF_INET6 && literal->address.family == AF_INET &&
        (hints.ai_flags & AI_V4MAPPED)) {
      literal->address = v4_mapped(literal->address);
    }
    if (family != AF_UNSPEC && family != literal->address.family) return EAI_ADDRFAMILY;
    out->push_back(literal->address);
    *scope_id = literal->scope_id;
    *canonical = node;
    return 0;
  }
  if (hints.ai_flags & AI_NUMERICHOST) return EAI_NONAME;
  bool map = family == AF_INET6 && (hints.ai_flags & AI_V4MAPPED);
  Lookup found = lookup(node, map ? AF_UNSPEC : family, config);
  if (found.error != 0) return found.error;
  bool any_v6 = false;
  for (const Address& a : found.addresses) any_v6 = any_v6 || a.family == AF_INET6;
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

}  // namespace

int get_addr_info(const char* node, const char* service, const addrinfo* hints_in, addrinfo** res,
                  const Config& config) {
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
  uint16_t port = 0;
  if (service != nullptr && *service != '\0') {
    char* end = nullptr;
    errno = 0;
    unsigned long n = std::strtoul(service, &end, 10);
    if (*end != '\0' || errno != 0 || n > 65535) return EAI_SERVICE;  // no /etc/services
    port = static_cast<uint16_t>(n);
  }
  std::vector<Address> addresses;
  uint32_t scope_id = 0;
  std::string canonical;
  if (int rc = addresses_of(node, hints, config, &addresses, &scope_id, &canonical); rc != 0) {
    return rc;
  }
  std::vector<SocketKind> kinds = socket_kinds(hints);
  if (kinds.empty()) return EAI_SOCKTYPE;
  addrinfo** tail = res;
  for (const Address& a : addresses) {
    for (const SocketKind& k : kinds) {
      auto* n = new Node;
      n->ai.ai_family = a.family;
      n->ai.ai_socktype = k.socktype;
      n->ai.ai_protocol = k.protocol;
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
        sin6->sin6_scope_id = scope_id;
        n->ai.ai_addrlen = sizeof(sockaddr_in6);
      }
      if (tail == res && (hints.ai_flags & AI_CANONNAME) && !canonical.empty()) {
        n->ai.ai_canonname = ::strdup(canonical.c_str());
      }
      *tail = &n->ai;
      tail = &n->ai.ai_next;
    }
  }
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

}  // namespace ddprun::sys::dns
