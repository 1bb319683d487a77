// The NSS-free resolver of the static builds against a hosts file the test writes and a tiny
// DNS server on a loopback UDP port.
#include "store/sys/dns_resolver.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>

#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "store/sys/fd.hpp"
#include "store/sys/temp_dir.hpp"

namespace ddprun::sys::dns {
namespace {

using std::chrono::milliseconds;

Address v4(const char* text) {
  Address a{AF_INET, {}};
  ::inet_pton(AF_INET, text, a.bytes.data());
  return a;
}

Address v6(const char* text) {
  Address a{AF_INET6, {}};
  ::inet_pton(AF_INET6, text, a.bytes.data());
  return a;
}

void put16(std::vector<uint8_t>& out, uint16_t v) {
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

void put_name(std::vector<uint8_t>& out, const std::string& name) {
  std::vector<uint8_t> q = encode_query(0, name, 0);
  out.insert(out.end(), q.begin() + 12, q.end() - 4);  // the question's name
}

// What the fake server knows about one name.
struct Entry {
  std::vector<Address> addresses;
  std::string cname;  // answered as a CNAME to this name, whose addresses follow
  int rcode = kRcodeOk;
  bool silent = false;  // never answers
};

Entry answers(std::vector<Address> addresses) {
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

Entry silence() {
  Entry e;
  e.silent = true;
  return e;
}

// A DNS server on 127.0.0.1:<ephemeral> that answers from a table and logs the questions.
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
    stop_ = make_pipe();
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeDns() {
    write_all(stop_.write.get(), "x", 1);
    thread_.join();
  }

  Nameserver nameserver() const {
    Nameserver ns;
    auto* sin = reinterpret_cast<sockaddr_in*>(&ns.addr);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port_);
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ns.len = sizeof(sockaddr_in);
    return ns;
  }

  // "name A", "name AAAA", in the order asked.
  std::vector<std::string> questions() {
    std::lock_guard<std::mutex> lock(mu_);
    return questions_;
  }

 private:
  void serve() {
    pollfd fds[2] = {{sock_.get(), POLLIN, 0}, {stop_.read.get(), POLLIN, 0}};
    while (::poll(fds, 2, -1) > 0 && !(fds[1].revents & POLLIN)) {
      uint8_t buf[512];
      sockaddr_storage peer{};
      socklen_t peer_len = sizeof peer;
      ssize_t n = ::recvfrom(sock_.get(), buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&peer),
                             &peer_len);
      if (n < 12) continue;
      std::string name;
      size_t pos = 12;
      while (pos < static_cast<size_t>(n) && buf[pos] != 0) {
        if (!name.empty()) name += '.';
        name.append(reinterpret_cast<char*>(buf + pos + 1), buf[pos]);
        pos += 1 + buf[pos];
      }
      uint16_t type = static_cast<uint16_t>(buf[pos + 1] << 8 | buf[pos + 2]);
      {
        std::lock_guard<std::mutex> lock(mu_);
        questions_.push_back(name + (type == kTypeA ? " A" : " AAAA"));
      }
      std::vector<uint8_t> reply = answer(buf, pos + 5, name, type);
      if (!reply.empty()) {
        ::sendto(sock_.get(), reply.data(), reply.size(), 0, reinterpret_cast<sockaddr*>(&peer),
                 peer_len);
      }
    }
  }

  std::vector<uint8_t> answer(const uint8_t* query, size_t question_end, const std::string& name,
                              uint16_t type) {
    auto it = table_.find(name);
    Entry entry;
    entry.rcode = kRcodeNameError;
    if (it != table_.end()) entry = it->second;
    if (entry.silent) return {};
    std::string owner = name;
    std::vector<uint8_t> out(query, query + 2);
    put16(out, static_cast<uint16_t>(0x8180 | entry.rcode));
    std::vector<uint8_t> body;
    uint16_t count = 0;
    if (!entry.cname.empty()) {
      body.push_back(0xc0);  // owner: a pointer to the question's name
      body.push_back(12);
      put16(body, kTypeCname);
      put16(body, kClassIn);
      put16(body, 0);
      put16(body, 60);
      std::vector<uint8_t> target;
      put_name(target, entry.cname);
      put16(body, static_cast<uint16_t>(target.size()));
      body.insert(body.end(), target.begin(), target.end());
      ++count;
      owner = entry.cname;
      entry.addresses = table_[entry.cname].addresses;
    }
    for (const Address& a : entry.addresses) {
      if ((a.family == AF_INET) != (type == kTypeA)) continue;
      put_name(body, owner);
      put16(body, type);
      put16(body, kClassIn);
      put16(body, 0);
      put16(body, 60);
      put16(body, a.family == AF_INET ? 4 : 16);
      body.insert(body.end(), a.bytes.begin(), a.bytes.begin() + (a.family == AF_INET ? 4 : 16));
      ++count;
    }
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
  Pipe stop_;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::vector<std::string> questions_;
  std::thread thread_;
};

class DnsResolverTest : public ::testing::Test {
 protected:
  Config config_with(const FakeDns& dns, const std::string& hosts = "") {
    std::ofstream(dir_.path() + "/hosts") << hosts;
    Config c;
    c.hosts_path = dir_.path() + "/hosts";
    c.nameservers = {dns.nameserver()};
    c.timeout = milliseconds(2000);
    return c;
  }
  TempDir dir_{"ddprun-dns-test-"};
};

TEST(DnsConfigTest, ParsesResolvConf) {
  Config c = parse_resolv_conf(
      "# comment\nnameserver 10.0.0.2\nnameserver ::1\nnameserver bogus\n"
      "nameserver 10.0.0.3\nnameserver 10.0.0.4\n"
      "domain old.example\nsearch a.example b.example. ; trailing\n"
      "options rotate ndots:2 timeout:3 attempts:9\n");
  ASSERT_EQ(c.nameservers.size(), 3u);  // glibc's limit; the bad one is skipped
  EXPECT_EQ(c.nameservers[0].addr.ss_family, AF_INET);
  EXPECT_EQ(c.nameservers[1].addr.ss_family, AF_INET6);
  EXPECT_EQ(ntohs(reinterpret_cast<sockaddr_in*>(&c.nameservers[2].addr)->sin_port), 53);
  EXPECT_EQ(c.search, (std::vector<std::string>{"a.example", "b.example"}));  // the last wins
  EXPECT_EQ(c.ndots, 2);
  EXPECT_EQ(c.timeout, std::chrono::seconds(3));
  EXPECT_EQ(c.attempts, 5);  // capped
}

TEST(DnsConfigTest, LiteralsKeepTheirScope) {
  EXPECT_EQ(parse_literal("10.1.2.3")->address, v4("10.1.2.3"));
  auto scoped = parse_literal("fe80::1%7");
  ASSERT_TRUE(scoped);
  EXPECT_EQ(scoped->scope_id, 7u);
  EXPECT_FALSE(parse_literal("fe80::1%no-such-if"));
  EXPECT_FALSE(parse_literal("db.example"));
}

TEST_F(DnsResolverTest, HostsFileAnswersBeforeDns) {
  FakeDns dns({{"node1", answers({v4("10.9.9.9")})}});
  Config c = config_with(dns,
                         "127.0.0.1 localhost\n"
                         "10.0.0.1   Node1.cluster node1   # the first node\n"
                         "fd00::1 node1.cluster node1\n"
                         "10.0.0.2 node2\n"
                         "#10.0.0.3 node1\n");
  Lookup l = lookup("NODE1", AF_UNSPEC, c);
  EXPECT_EQ(l.error, 0);
  EXPECT_EQ(l.addresses, (std::vector<Address>{v4("10.0.0.1"), v6("fd00::1")}));
  EXPECT_EQ(l.canonical, "Node1.cluster");
  EXPECT_EQ(lookup("node1", AF_INET6, c).addresses, std::vector<Address>{v6("fd00::1")});
  EXPECT_TRUE(dns.questions().empty());
}

TEST_F(DnsResolverTest, AsksDnsForAAndAaaaAndFollowsTheCanonicalName) {
  FakeDns dns({{"db.example", alias_of("real.example")},
               {"real.example", answers({v6("fd00::5"), v4("10.0.0.5")})}});
  Config c = config_with(dns);
  Lookup l = lookup("db.example", AF_UNSPEC, c);
  EXPECT_EQ(l.error, 0);
  EXPECT_EQ(l.addresses, (std::vector<Address>{v4("10.0.0.5"), v6("fd00::5")}));
  EXPECT_EQ(l.canonical, "real.example");
  EXPECT_EQ(dns.questions().size(), 2u);
}

TEST_F(DnsResolverTest, SearchDomainsAndNdots) {
  FakeDns dns({{"db.b.test", answers({v4("10.0.0.7")})}, {"x.y", answers({v4("10.0.0.8")})}});
  Config c = config_with(dns);
  c.search = {"a.test", "b.test"};
  // No dot (< ndots 1): the search domains first; the found one stops the search.
  EXPECT_EQ(lookup("db", AF_INET, c).addresses, std::vector<Address>{v4("10.0.0.7")});
  EXPECT_EQ(dns.questions(), (std::vector<std::string>{"db.a.test A", "db.b.test A"}));
  // One dot: the name as is first.
  EXPECT_EQ(lookup("x.y", AF_INET, c).addresses, std::vector<Address>{v4("10.0.0.8")});
  EXPECT_EQ(dns.questions().back(), "x.y A");
  // A trailing dot: exactly that name.
  EXPECT_EQ(lookup("db.", AF_INET, c).error, EAI_NONAME);
  EXPECT_EQ(dns.questions().back(), "db A");
  // ndots 2: "x.y" goes through the search list before as is.
  c.ndots = 2;
  size_t before = dns.questions().size();
  EXPECT_EQ(lookup("x.y", AF_INET, c).error, 0);
  auto q = dns.questions();
  EXPECT_EQ(std::vector<std::string>(q.begin() + before, q.end()),
            (std::vector<std::string>{"x.y.a.test A", "x.y.b.test A", "x.y A"}));
}

TEST_F(DnsResolverTest, UnknownNamesAndLocalhost) {
  FakeDns dns({});
  Config c = config_with(dns);
  EXPECT_EQ(lookup("nowhere.example", AF_UNSPEC, c).error, EAI_NONAME);
  EXPECT_EQ(lookup("a..b", AF_UNSPEC, c).error, EAI_NONAME);
  EXPECT_EQ(lookup(std::string(300, 'a'), AF_UNSPEC, c).error, EAI_NONAME);
  Lookup local = lookup("localhost", AF_UNSPEC, c);  // not in the (empty) hosts file
  EXPECT_EQ(local.addresses, (std::vector<Address>{v4("127.0.0.1"), v6("::1")}));
}

TEST_F(DnsResolverTest, SilentAndClosedServersFallThroughToTheNextOne) {
  FakeDns silent({{"db.example", silence()}});
  FakeDns failing({{"db.example", failure(kRcodeServerFailure)}});
  FakeDns good({{"db.example", answers({v4("10.0.0.9")})}});
  Config c = config_with(good);
  c.timeout = milliseconds(300);
  Nameserver closed = good.nameserver();
  reinterpret_cast<sockaddr_in*>(&closed.addr)->sin_port = htons(1);  // nothing listens
  c.nameservers = {closed, silent.nameserver(), failing.nameserver(), good.nameserver()};
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(lookup("db.example", AF_INET, c).addresses, std::vector<Address>{v4("10.0.0.9")});
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3000));
  EXPECT_EQ(silent.questions().size(), 1u);
  EXPECT_EQ(failing.questions().size(), 1u);
  // Nobody answers: a temporary failure after every attempt, not "no such name".
  c.nameservers = {silent.nameserver()};
  c.attempts = 2;
  EXPECT_EQ(lookup("db.example", AF_INET, c).error, EAI_AGAIN);
  EXPECT_EQ(silent.questions().size(), 3u);
}

TEST_F(DnsResolverTest, GetAddrInfoBuildsTheList) {
  FakeDns dns({{"db.example", answers({v4("10.0.0.5"), v6("fd00::5")})}});
  Config c = config_with(dns);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_CANONNAME;
  addrinfo* res = nullptr;
  ASSERT_EQ(get_addr_info("db.example", "29500", &hints, &res, c), 0);
  ASSERT_NE(res, nullptr);
  EXPECT_STREQ(res->ai_canonname, "db.example");
  EXPECT_EQ(res->ai_family, AF_INET);
  EXPECT_EQ(res->ai_protocol, IPPROTO_TCP);
  EXPECT_EQ(ntohs(reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_port), 29500);
  ASSERT_NE(res->ai_next, nullptr);
  EXPECT_EQ(res->ai_next->ai_family, AF_INET6);
  EXPECT_EQ(res->ai_next->ai_addrlen, sizeof(sockaddr_in6));
  EXPECT_EQ(res->ai_next->ai_next, nullptr);
  free_addr_info(res);

  hints.ai_flags = AI_PASSIVE;
  hints.ai_family = AF_INET;
  ASSERT_EQ(get_addr_info(nullptr, "80", &hints, &res, c), 0);
  EXPECT_EQ(reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr.s_addr, htonl(INADDR_ANY));
  free_addr_info(res);

  hints = {};
  hints.ai_flags = AI_NUMERICHOST;
  EXPECT_EQ(get_addr_info("db.example", nullptr, &hints, &res, c), EAI_NONAME);
  EXPECT_EQ(get_addr_info("::1", "http", &hints, &res, c), EAI_SERVICE);
  ASSERT_EQ(get_addr_info("::1", nullptr, &hints, &res, c), 0);
  int n = 0;
  for (addrinfo* a = res; a; a = a->ai_next) ++n;
  EXPECT_EQ(n, 2);  // a stream and a datagram entry
  free_addr_info(res);

  hints = {};
  hints.ai_family = AF_INET6;
  hints.ai_flags = AI_V4MAPPED;
  ASSERT_EQ(get_addr_info("10.1.2.3", "1", &hints, &res, c), 0);
  EXPECT_TRUE(IN6_IS_ADDR_V4MAPPED(&reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr));
  free_addr_info(res);
}

TEST(DnsMessageTest, HostileResponsesAreRejected) {
  std::vector<uint8_t> header = {0, 1, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0};
  std::vector<uint8_t> loop = header;
  loop.insert(loop.end(), {0xc0, 12, 0, 1, 0, 1});  // the question's name points at itself
  EXPECT_FALSE(decode_response(loop.data(), loop.size()));
  std::vector<uint8_t> short_rdata = header;
  put_name(short_rdata, "a");
  short_rdata.insert(short_rdata.end(), {0, 1, 0, 1});
  put_name(short_rdata, "a");
  short_rdata.insert(short_rdata.end(), {0, 1, 0, 1, 0, 0, 0, 60, 0, 200, 10, 0});
  EXPECT_FALSE(decode_response(short_rdata.data(), short_rdata.size()));
  std::vector<uint8_t> query = encode_query(7, "a.b", kTypeA);
  EXPECT_FALSE(decode_response(query.data(), query.size()));  // not a response
  for (size_t n = 0; n < short_rdata.size(); ++n) decode_response(short_rdata.data(), n);
}

TEST(DnsMessageTest, NamesAreValidated) {
  EXPECT_TRUE(valid_name("a.b."));
  EXPECT_FALSE(valid_name(""));
  EXPECT_FALSE(valid_name("."));
  EXPECT_FALSE(valid_name(std::string(64, 'a')));
  EXPECT_TRUE(valid_name(std::string(63, 'a')));
}

}  // namespace
}  // namespace ddprun::sys::dns
