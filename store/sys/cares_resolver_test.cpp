// The static builds' resolver over c-ares against a resolv.conf and a hosts file the test
// writes and tiny DNS servers on loopback UDP ports.
#include "store/sys/cares_resolver.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "store/sys/fd.hpp"
#include "store/sys/temp_dir.hpp"

namespace ddprun::sys::cares {
namespace {

using std::chrono::milliseconds;

constexpr uint16_t kTypeA = 1;
constexpr uint16_t kTypeCname = 5;
constexpr uint16_t kTypeAaaa = 28;
constexpr uint16_t kClassIn = 1;
constexpr int kRcodeServerFailure = 2;
constexpr int kRcodeNameError = 3;

void put16(std::vector<uint8_t>& out, uint16_t v) {
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

// A name as labels, uncompressed.
void put_name(std::vector<uint8_t>& out, const std::string& name) {
  size_t start = 0;
  while (start < name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    out.push_back(static_cast<uint8_t>(dot - start));
    out.insert(out.end(), name.begin() + start, name.begin() + dot);
    start = dot + 1;
  }
  out.push_back(0);
}

void put_record(std::vector<uint8_t>& out, const std::string& owner, uint16_t type,
                const std::vector<uint8_t>& data) {
  put_name(out, owner);
  put16(out, type);
  put16(out, kClassIn);
  put16(out, 0);
  put16(out, 60);  // TTL
  put16(out, static_cast<uint16_t>(data.size()));
  out.insert(out.end(), data.begin(), data.end());
}

// What the fake server knows about one name.
struct Entry {
  std::vector<std::string> addresses;  // "10.0.0.1", "fd00::1"
  std::string cname;                   // answered as a CNAME to this name, followed
  int rcode = 0;
  bool silent = false;     // never answers
  bool truncated = false;  // over UDP, an empty answer with TC set; over TCP, the addresses
};

Entry answers(std::vector<std::string> addresses) {
  Entry e;
  e.addresses = std::move(addresses);
  return e;
}

Entry alias_of(std::string target) {
  Entry e;
  e.cname = std::move(target);
  return e;
}

Entry failure(int rcode) {
  Entry e;
  e.rcode = rcode;
  return e;
}

Entry too_big_for_udp(std::vector<std::string> addresses) {
  Entry e = answers(std::move(addresses));
  e.truncated = true;
  return e;
}

Entry silence() {
  Entry e;
  e.silent = true;
  return e;
}

// A DNS server on 127.0.0.1:<ephemeral>, UDP and TCP, that answers from a table and logs the
// questions.
class FakeDns {
 public:
  explicit FakeDns(std::map<std::string, Entry> table) : table_(std::move(table)) {
    sock_.reset(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(sock_.get(), reinterpret_cast<sockaddr*>(&sin), sizeof sin), 0);
    socklen_t len = sizeof sin;
    ::getsockname(sock_.get(), reinterpret_cast<sockaddr*>(&sin), &len);
    port_ = ntohs(sin.sin_port);
    listener_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&sin), sizeof sin), 0);
    EXPECT_EQ(::listen(listener_.get(), 4), 0);
    stop_ = make_pipe();
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeDns() {
    write_all(stop_.write.get(), "x", 1);
    thread_.join();
  }

  std::string server() const { return "127.0.0.1:" + std::to_string(port_); }

  // "name A", "name AAAA" ("name A tcp" over TCP), in the order asked.
  std::vector<std::string> questions() {
    std::lock_guard<std::mutex> lock(mu_);
    return questions_;
  }

 private:
  void serve() {
    pollfd fds[3] = {
        {sock_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}, {stop_.read.get(), POLLIN, 0}};
    while (::poll(fds, 3, -1) > 0 && !(fds[2].revents & POLLIN)) {
      if (fds[1].revents & POLLIN)
        serve_tcp(UniqueFd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC)));
      if (!(fds[0].revents & POLLIN)) continue;
      uint8_t buf[512];
      sockaddr_storage peer{};
      socklen_t peer_len = sizeof peer;
      ssize_t n = ::recvfrom(sock_.get(), buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&peer),
                             &peer_len);
      std::vector<uint8_t> reply = reply_to(buf, n, false);
      if (!reply.empty()) {
        ::sendto(sock_.get(), reply.data(), reply.size(), 0, reinterpret_cast<sockaddr*>(&peer),
                 peer_len);
      }
    }
  }

  // Queries after a two-byte length each, until the client closes the connection.
  void serve_tcp(UniqueFd conn) {
    uint8_t len[2];
    uint8_t buf[512];
    while (::recv(conn.get(), len, 2, MSG_WAITALL) == 2) {
      const size_t size = std::min<size_t>(sizeof buf, len[0] << 8 | len[1]);
      ssize_t n = ::recv(conn.get(), buf, size, MSG_WAITALL);
      std::vector<uint8_t> reply = reply_to(buf, n, true);
      if (reply.empty()) return;
      std::vector<uint8_t> out;
      put16(out, static_cast<uint16_t>(reply.size()));
      out.insert(out.end(), reply.begin(), reply.end());
      write_all(conn.get(), reinterpret_cast<const char*>(out.data()), out.size());
    }
  }

  // The answer to one query (none for a silent name or garbage), the question logged.
  std::vector<uint8_t> reply_to(const uint8_t* buf, ssize_t n, bool tcp) {
    if (n < 12) return {};
    std::string name;
    size_t pos = 12;
    while (pos < static_cast<size_t>(n) && buf[pos] != 0) {
      if (!name.empty()) name += '.';
      name.append(reinterpret_cast<const char*>(buf + pos + 1), buf[pos]);
      pos += 1 + buf[pos];
    }
    if (pos + 5 > static_cast<size_t>(n)) return {};
    uint16_t type = static_cast<uint16_t>(buf[pos + 1] << 8 | buf[pos + 2]);
    {
      std::lock_guard<std::mutex> lock(mu_);
      questions_.push_back(name + (type == kTypeA ? " A" : " AAAA") + (tcp ? " tcp" : ""));
    }
    return answer(buf, pos + 5, name, type, tcp);
  }

  std::vector<uint8_t> answer(const uint8_t* query, size_t question_end, const std::string& name,
                              uint16_t type, bool tcp) {
    auto it = table_.find(name);
    Entry entry = it != table_.end() ? it->second : failure(kRcodeNameError);
    if (entry.silent) return {};
    const bool truncate = entry.truncated && !tcp;
    if (truncate) entry.addresses.clear();
    std::vector<uint8_t> body;
    uint16_t count = 0;
    std::string owner = name;
    while (!entry.cname.empty() && count < 8) {
      std::vector<uint8_t> target;
      put_name(target, entry.cname);
      put_record(body, owner, kTypeCname, target);
      ++count;
      owner = entry.cname;
      entry = table_[owner];
    }
    for (const std::string& text : entry.addresses) {
      std::vector<uint8_t> data(type == kTypeA ? 4 : 16);
      if (::inet_pton(type == kTypeA ? AF_INET : AF_INET6, text.c_str(), data.data()) != 1) {
        continue;  // the other family
      }
      put_record(body, owner, type, data);
      ++count;
    }
    std::vector<uint8_t> out(query, query + 2);  // the query's id
    put16(out, static_cast<uint16_t>(0x8180 | (truncate ? 0x0200 : 0) | entry.rcode));
    put16(out, 1);
    put16(out, count);
    put16(out, 0);
    put16(out, 0);
    out.insert(out.end(), query + 12, query + question_end);
    out.insert(out.end(), body.begin(), body.end());
    return out;
  }

  std::map<std::string, Entry> table_;
  UniqueFd sock_;
  UniqueFd listener_;
  Pipe stop_;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::vector<std::string> questions_;
  std::thread thread_;
};

std::string text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
    return buf;
  }
  const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(sa);
  ::inet_ntop(AF_INET6, &sin6->sin6_addr, buf, sizeof buf);
  std::string out = buf;
  if (sin6->sin6_scope_id != 0) out += "%" + std::to_string(sin6->sin6_scope_id);
  return out;
}

// One get_addr_info() call, its list as text.
struct Resolved {
  int rc = -1;
  std::vector<std::string> addresses;  // one per entry, in order
  std::string canonical;
};

Resolved resolve(const char* node, int family, int flags, const Options& options,
                 const char* service = nullptr) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_flags = flags;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  Resolved out;
  out.rc = get_addr_info(node, service, &hints, &res, options);
  for (addrinfo* a = res; a; a = a->ai_next) out.addresses.push_back(text(a->ai_addr));
  if (res && res->ai_canonname) out.canonical = res->ai_canonname;
  free_addr_info(res);
  return out;
}

using Texts = std::vector<std::string>;

class CaresResolverTest : public ::testing::Test {
 protected:
  // Options that read the test's resolv.conf and hosts file and ask `servers`. CARES_HOSTS is
  // set here, on the test's one thread that reads the environment.
  Options options(const std::string& servers, const std::string& resolv_conf = "",
                  const std::string& hosts = "") {
    std::ofstream(dir_.path() + "/resolv.conf") << resolv_conf;
    std::ofstream(dir_.path() + "/hosts") << hosts;
    ::setenv("CARES_HOSTS", (dir_.path() + "/hosts").c_str(), 1);
    Options o;
    o.resolv_conf = dir_.path() + "/resolv.conf";
    o.servers = servers;
    o.timeout = milliseconds(2000);
    o.hosts_from_env = true;
    return o;
  }
  TempDir dir_{"ddprun-cares-test-"};
};

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
}  // namespace ddprun::sys::cares
