// The static builds' resolver over c-ares asking DNS: A and AAAA, CNAMEs to the canonical name,
// resolv.conf's search domains, ndots, timeout and attempts, unknown names, silent, failing and
// closed servers, and TCP after a truncated answer. A resolv.conf the test writes and fake DNS
// servers on loopback UDP and TCP ports (fake_dns_server_test_util.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "store/sys/cares_resolver.hpp"
#include "store/sys/fake_dns_server_test_util.hpp"

namespace ddprun::sys::cares::test {
namespace {

TEST(ResolvOptionsTest, TimeoutAndAttemptsAreReadAndCapped) {
  RetryLimits none = parse_resolv_options("nameserver 10.0.0.2\nsearch a.example\n");
  EXPECT_EQ(none.timeout, milliseconds(5000));  // glibc's defaults
  EXPECT_EQ(none.attempts, 2);
  RetryLimits set = parse_resolv_options(
      "options rotate timeout:3 attempts:4\n# options timeout:7\noptions ndots:2 attempts:3\n");
  EXPECT_EQ(set.timeout, std::chrono::seconds(3));
  EXPECT_EQ(set.attempts, 3);  // the last one wins
  RetryLimits capped = parse_resolv_options("options timeout:99 attempts:9\n");
  EXPECT_EQ(capped.timeout, std::chrono::seconds(30));
  EXPECT_EQ(capped.attempts, 5);
  RetryLimits floor = parse_resolv_options("options timeout:0 attempts:0 ; timeout:4\n");
  EXPECT_EQ(floor.timeout, std::chrono::seconds(1));
  EXPECT_EQ(floor.attempts, 1);
}

TEST_F(CaresResolverTest, AsksDnsForAAndAaaaAndFollowsCnamesToTheCanonicalName) {
  FakeDns dns({{"db.example", alias_of("mid.example")},
               {"mid.example", alias_of("real.example")},
               {"real.example", answers({"fd00::5", "10.0.0.5"})}});
  Options o = options(dns.server());
  Resolved r = resolve("db.example", AF_UNSPEC, AI_CANONNAME, o, "29500");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.addresses, (Texts{"10.0.0.5", "fd00::5"}));
  EXPECT_EQ(r.canonical, "real.example");
  auto q = dns.questions();
  std::sort(q.begin(), q.end());
  EXPECT_EQ(q, (Texts{"db.example A", "db.example AAAA"}));
  EXPECT_EQ(resolve("db.example", AF_INET, 0, o).canonical, "");  // without AI_CANONNAME
}

TEST_F(CaresResolverTest, SearchDomainsAndNdotsComeFromResolvConf) {
  FakeDns dns({{"db.b.test", answers({"10.0.0.7"})}, {"x.y", answers({"10.0.0.8"})}});
  Options o = options(dns.server(), "search a.test b.test\n");
  // No dot (< ndots 1): the search domains first; the found one stops the search.
  Resolved db = resolve("db", AF_INET, AI_CANONNAME, o);
  EXPECT_EQ(db.addresses, Texts{"10.0.0.7"});
  EXPECT_EQ(db.canonical, "db.b.test");
  EXPECT_EQ(dns.questions(), (Texts{"db.a.test A", "db.b.test A"}));
  // One dot: the name as is first.
  EXPECT_EQ(resolve("x.y", AF_INET, 0, o).addresses, Texts{"10.0.0.8"});
  EXPECT_EQ(dns.questions().back(), "x.y A");
  // A trailing dot: exactly that name.
  EXPECT_EQ(resolve("db.", AF_INET, 0, o).rc, EAI_NONAME);
  EXPECT_EQ(dns.questions().back(), "db A");
  // ndots 2: "x.y" goes through the search list before as is.
  o = options(dns.server(), "search a.test b.test\noptions ndots:2\n");
  size_t before = dns.questions().size();
  EXPECT_EQ(resolve("x.y", AF_INET, 0, o).rc, 0);
  auto q = dns.questions();
  EXPECT_EQ(Texts(q.begin() + before, q.end()), (Texts{"x.y.a.test A", "x.y.b.test A", "x.y A"}));
}

TEST_F(CaresResolverTest, UnknownNamesAreNoName) {
  FakeDns dns({{"v4only.example", answers({"10.0.0.3"})}});
  Options o = options(dns.server(), "search a.test\n");
  EXPECT_EQ(resolve("nowhere.example", AF_UNSPEC, 0, o).rc, EAI_NONAME);  // NXDOMAIN
  EXPECT_EQ(resolve("v4only.example", AF_INET6, 0, o).rc, EAI_NONAME);    // no AAAA
  EXPECT_EQ(resolve("a..b", AF_UNSPEC, 0, o).rc, EAI_NONAME);
  EXPECT_EQ(resolve(std::string(300, 'a').c_str(), AF_UNSPEC, 0, o).rc, EAI_NONAME);
  EXPECT_EQ(resolve("", AF_UNSPEC, 0, o).rc, EAI_NONAME);
}

TEST_F(CaresResolverTest, SilentServerIsAgainAfterTheConfiguredTimeoutAndAttempts) {
  FakeDns silent({{"db.example", silence()}});
  Options o = options(silent.server(), "options attempts:1\n");
  o.timeout = milliseconds(200);
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(resolve("db.example", AF_INET, 0, o).rc, EAI_AGAIN);  // not "no such name"
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, milliseconds(150));
  EXPECT_LT(took, milliseconds(1000));
  EXPECT_EQ(silent.questions().size(), 1u);
  // attempts:2 asks twice (the second round waits twice as long).
  o = options(silent.server(), "options attempts:2\n");
  o.timeout = milliseconds(100);
  EXPECT_EQ(resolve("db.example", AF_INET, 0, o).rc, EAI_AGAIN);
  EXPECT_EQ(silent.questions().size(), 3u);
}

TEST_F(CaresResolverTest, ClosedSilentAndFailingServersFallThroughToTheNextOne) {
  FakeDns silent({{"db.example", silence()}});
  FakeDns failing({{"db.example", failure(kRcodeServerFailure)}});
  FakeDns good({{"db.example", answers({"10.0.0.9"})}});
  // Port 1 of loopback: nothing listens there, which a connected UDP socket learns at once,
  // long before the timeout.
  // Both families: the A and the AAAA query share the socket that learns it.
  Options o = options("127.0.0.1:1," + good.server(), "options attempts:1\n");
  o.timeout = milliseconds(3000);
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(resolve("db.example", AF_UNSPEC, 0, o).addresses, Texts{"10.0.0.9"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1500));
  // A silent one costs its timeout, a failing one (SERVFAIL) nothing.
  o = options(silent.server() + "," + failing.server() + "," + good.server(),
              "options attempts:1\n");
  o.timeout = milliseconds(300);
  start = std::chrono::steady_clock::now();
  EXPECT_EQ(resolve("db.example", AF_INET, 0, o).addresses, Texts{"10.0.0.9"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
  EXPECT_EQ(silent.questions().size(), 1u);
  EXPECT_EQ(failing.questions().size(), 1u);
  EXPECT_EQ(good.questions().size(), 3u);
}

TEST_F(CaresResolverTest, TruncatedAnswersAreAskedAgainOverTcp) {
  FakeDns dns({{"big.example", too_big_for_udp({"10.0.0.10", "fd00::10"})}});
  Options o = options(dns.server());
  EXPECT_EQ(resolve("big.example", AF_UNSPEC, 0, o).addresses, (Texts{"10.0.0.10", "fd00::10"}));
  auto q = dns.questions();
  std::sort(q.begin(), q.end());
  EXPECT_EQ(
      q, (Texts{"big.example A", "big.example A tcp", "big.example AAAA", "big.example AAAA tcp"}));
}

}  // namespace
}  // namespace ddprun::sys::cares::test
