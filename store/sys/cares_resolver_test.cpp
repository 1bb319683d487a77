// The static builds' resolver over c-ares, what get_addr_info() makes of its arguments:
// literals (never looked up), the hosts file before DNS, localhost as loopback, no node, flags,
// services and hints, AI_V4MAPPED, and the list free_addr_info() frees. A resolv.conf and hosts
// file the test writes, a fake DNS server on loopback (fake_dns_server_test_util.hpp); the DNS
// side itself is in cares_resolver_dns_test.cpp.
#include "store/sys/cares_resolver.hpp"

#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>

#include <string>
#include <utility>
#include <vector>

#include "store/sys/fake_dns_server_test_util.hpp"

namespace ddprun::sys::cares::test {
namespace {

TEST_F(CaresResolverTest, LiteralsAreNeverLookedUp) {
  FakeDns dns({});
  Options o = options(dns.server());
  Resolved v4 = resolve("10.1.2.3", AF_UNSPEC, AI_CANONNAME, o, "29500");
  EXPECT_EQ(v4.rc, 0);
  EXPECT_EQ(v4.addresses, Texts{"10.1.2.3"});
  EXPECT_EQ(v4.canonical, "10.1.2.3");
  EXPECT_EQ(resolve("::1", AF_UNSPEC, 0, o).addresses, Texts{"::1"});
  EXPECT_EQ(resolve("fe80::1%7", AF_INET6, 0, o).addresses, Texts{"fe80::1%7"});
  const unsigned lo = ::if_nametoindex("lo");
  ASSERT_NE(lo, 0u);
  EXPECT_EQ(resolve("fe80::1%lo", AF_UNSPEC, 0, o).addresses,
            Texts{"fe80::1%" + std::to_string(lo)});
  EXPECT_EQ(resolve("10.1.2.3", AF_INET6, 0, o).rc, EAI_ADDRFAMILY);
  EXPECT_EQ(resolve("fe80::1%no-such-if", AF_UNSPEC, AI_NUMERICHOST, o).rc, EAI_NONAME);
  EXPECT_TRUE(dns.questions().empty());
}

TEST_F(CaresResolverTest, HostsFileAnswersBeforeDns) {
  FakeDns dns({{"node1", answers({"10.9.9.9"})}});
  Options o = options(dns.server(), "",
                      "127.0.0.1 localhost\n"
                      "fd00::1 node1.cluster node1\n"
                      "10.0.0.1   Node1.cluster node1   # the first node\n"
                      "10.0.0.2 node2\n"
                      "#10.0.0.3 node1\n");
  Resolved both = resolve("NODE1", AF_UNSPEC, AI_CANONNAME, o);
  EXPECT_EQ(both.rc, 0);
  EXPECT_EQ(both.addresses, (Texts{"10.0.0.1", "fd00::1"}));  // IPv4 first
  EXPECT_EQ(both.canonical, "node1.cluster");                 // the first matching line's
  EXPECT_EQ(resolve("node1", AF_INET6, 0, o).addresses, Texts{"fd00::1"});
  EXPECT_EQ(resolve("node1.CLUSTER", AF_INET, 0, o).addresses, Texts{"10.0.0.1"});
  EXPECT_TRUE(dns.questions().empty());
}

TEST_F(CaresResolverTest, LocalhostIsLoopbackUnlessTheHostsFileSaysOtherwise) {
  FakeDns dns({{"localhost", answers({"10.6.6.6"})}, {"db.localhost", answers({"10.6.6.6"})}});
  Options o = options(dns.server());  // an empty hosts file
  Resolved local = resolve("localhost", AF_UNSPEC, AI_CANONNAME, o);
  EXPECT_EQ(local.addresses, (Texts{"127.0.0.1", "::1"}));
  EXPECT_EQ(local.canonical, "localhost");
  EXPECT_EQ(resolve("db.localhost", AF_UNSPEC, 0, o).addresses, (Texts{"127.0.0.1", "::1"}));
  EXPECT_EQ(resolve("LocalHost.", AF_INET6, 0, o).addresses, Texts{"::1"});
  EXPECT_TRUE(dns.questions().empty());  // never asked of DNS
  o = options(dns.server(), "", "10.9.0.1 localhost\n10.9.0.2 db.localhost\n");
  Resolved named = resolve("LOCALHOST", AF_UNSPEC, AI_CANONNAME, o);
  EXPECT_EQ(named.addresses, Texts{"10.9.0.1"});
  EXPECT_EQ(named.canonical, "localhost");  // the hosts file's spelling
  EXPECT_EQ(resolve("db.localhost", AF_UNSPEC, 0, o).addresses, Texts{"10.9.0.2"});
}

TEST_F(CaresResolverTest, FlagsServicesAndHints) {
  FakeDns dns({{"db.example", answers({"10.0.0.5", "fd00::5"})}});
  Options o = options(dns.server());
  // No node: the wildcard to bind (AI_PASSIVE), else loopback.
  EXPECT_EQ(resolve(nullptr, AF_INET, AI_PASSIVE, o, "80").addresses, Texts{"0.0.0.0"});
  EXPECT_EQ(resolve(nullptr, AF_UNSPEC, AI_PASSIVE, o, "80").addresses, (Texts{"0.0.0.0", "::"}));
  EXPECT_EQ(resolve(nullptr, AF_UNSPEC, 0, o, "80").addresses, (Texts{"127.0.0.1", "::1"}));
  // AI_NUMERICHOST refuses a name without asking.
  EXPECT_EQ(resolve("db.example", AF_UNSPEC, AI_NUMERICHOST, o).rc, EAI_NONAME);
  EXPECT_TRUE(dns.questions().empty());
  // Services are numbers (no /etc/services), AI_NUMERICSERV or not.
  EXPECT_EQ(resolve("::1", AF_UNSPEC, 0, o, "http").rc, EAI_SERVICE);
  EXPECT_EQ(resolve("::1", AF_UNSPEC, AI_NUMERICSERV, o, "70000").rc, EAI_SERVICE);
  EXPECT_EQ(resolve("::1", AF_UNSPEC, AI_NUMERICSERV, o, "29500").rc, 0);
  addrinfo hints{};
  addrinfo* res = nullptr;
  hints.ai_family = AF_UNIX;
  EXPECT_EQ(get_addr_info("::1", nullptr, &hints, &res, o), EAI_FAMILY);
  hints = {};
  hints.ai_socktype = SOCK_RAW;
  EXPECT_EQ(get_addr_info("::1", nullptr, &hints, &res, o), EAI_SOCKTYPE);
  EXPECT_EQ(get_addr_info(nullptr, nullptr, nullptr, &res, o), EAI_NONAME);
  EXPECT_EQ(res, nullptr);
}

TEST_F(CaresResolverTest, V4MappedOnlyWhenTheNameHasNoIpv6) {
  FakeDns dns(
      {{"v4.example", answers({"10.0.0.3"})}, {"both.example", answers({"10.0.0.4", "fd00::4"})}});
  Options o = options(dns.server());
  EXPECT_EQ(resolve("10.1.2.3", AF_INET6, AI_V4MAPPED, o).addresses, Texts{"::ffff:10.1.2.3"});
  EXPECT_EQ(resolve("v4.example", AF_INET6, AI_V4MAPPED, o).addresses, Texts{"::ffff:10.0.0.3"});
  EXPECT_EQ(resolve("both.example", AF_INET6, AI_V4MAPPED, o).addresses, Texts{"fd00::4"});
  EXPECT_EQ(resolve("v4.example", AF_INET6, 0, o).rc, EAI_NONAME);
}

TEST_F(CaresResolverTest, OneListPerCallFreedByFreeAddrInfo) {
  FakeDns dns({{"db.example", answers({"10.0.0.5", "fd00::5"})}});
  Options o = options(dns.server());
  addrinfo hints{};
  hints.ai_flags = AI_CANONNAME;
  addrinfo* res = nullptr;
  ASSERT_EQ(get_addr_info("db.example", "29500", &hints, &res, o), 0);
  // Every address as a stream and a datagram entry; the canonical name on the first only.
  std::vector<std::pair<int, int>> kinds;
  for (addrinfo* a = res; a; a = a->ai_next) {
    kinds.emplace_back(a->ai_family, a->ai_protocol);
    EXPECT_EQ(a->ai_addrlen, a->ai_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    EXPECT_EQ(ntohs(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_port), 29500);
    if (a != res) {
      EXPECT_EQ(a->ai_canonname, nullptr);
    }
  }
  EXPECT_EQ(kinds, (std::vector<std::pair<int, int>>{{AF_INET, IPPROTO_TCP},
                                                     {AF_INET, IPPROTO_UDP},
                                                     {AF_INET6, IPPROTO_TCP},
                                                     {AF_INET6, IPPROTO_UDP}}));
  EXPECT_STREQ(res->ai_canonname, "db.example");
  free_addr_info(res);
  free_addr_info(nullptr);
}

}  // namespace
}  // namespace ddprun::sys::cares::test
