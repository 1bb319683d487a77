// StoreProxy: every op through the proxy gives what the store gives, coalescing answers each
// client as if its request had been sent alone, waits and their cancellation, 1.13 clients,
// a last will, and the upstream link's loss.
#include "store/proxy.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "store/client.hpp"
#include "store/proxy_test_util.hpp"
#include "store/raw_client_test_util.hpp"
#include "store/server.hpp"
#include "store/test_frames.hpp"
#include "store/testing/linearizability.hpp"
#include "store/testing/workload.hpp"

namespace ddprun::store {
namespace {

using namespace std::chrono_literals;
using test::i64_bytes;
using test::Job;
using test::RawConn;
using test::Relay;
using test::RelayedJob;
using test::str_bytes;

// A listening socket on a free loopback port (the test plays the store's part on it), or -1.
int loopback_listener(uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || ::listen(fd, 16) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

// Runs a proxy on a loop of its own until its link to the store is lost (at most 10 s): the
// reason, and how long that took.
std::pair<std::string, std::chrono::steady_clock::duration> until_lost(const ProxyOptions& po) {
  boost::asio::io_context io;
  StoreProxy proxy(io, po);
  std::string why;
  proxy.on_upstream_lost([&why](const std::string& w) { why = w; });
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000 && why.empty(); ++i) io.run_for(10ms);
  return {why, std::chrono::steady_clock::now() - started};
}

TEST(StoreProxyTest, EveryOpGivesWhatTheStoreGives) {
  Job job;
  auto c = job.via_proxy();
  auto d = job.direct();
  c->set("/a", "1");
  EXPECT_EQ(d->get("/a"), "1");
  EXPECT_EQ(c->get("/a"), "1");
  EXPECT_EQ(c->add("/n", 5), 5);
  EXPECT_EQ(c->add("/n", -2), 3);
  EXPECT_EQ(c->compare_set("/a", "1", "2"), "2");
  EXPECT_EQ(c->compare_set("/a", "1", "3"), "2");
  EXPECT_TRUE(c->check({"/a", "/n"}));
  EXPECT_FALSE(c->check({"/a", "/none"}));
  EXPECT_EQ(c->num_keys(), 2);
  c->append("/a", "x");
  EXPECT_EQ(c->multi_get({"/a", "/n"}), (std::vector<std::string>{"2x", "3"}));
  c->multi_set({{"/m1", "v1"}, {"/m2", "v2"}});
  EXPECT_EQ(d->get("/m2"), "v2");
  EXPECT_TRUE(c->delete_key("/m1"));
  EXPECT_FALSE(c->delete_key("/m1"));
  c->queue_push("/q", "first");
  c->queue_push("/q", "second");
  EXPECT_EQ(c->queue_len("/q"), 2);
  EXPECT_EQ(c->queue_pop("/q"), "first");
  EXPECT_EQ(c->queue_pop("/q"), "second");
  EXPECT_EQ(c->queue_pop("/q"), std::nullopt);
  auto keys = c->list_keys();
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()),
            (std::set<std::string>{"/a", "/n", "/m2"}));
  c->ping();
  EXPECT_THROW(c->wait({"/later"}, 100ms), StoreError);
  c->ping();  // still usable after the timed-out WAIT
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    d->set("/later", "x");
  });
  c->wait({"/later"}, 10s);
  setter.join();
  std::thread other([&] {
    auto e = job.via_proxy();
    e->barrier("/bar", 2, 10s);
  });
  c->barrier("/bar", 2, 10s);
  other.join();
  EXPECT_GE(job.proxy->stats().client_requests, 25u);
}

// 8 clients ADD, GET and WAIT alike at once: each gets a distinct, consistent ADD result, the
// store sees fewer requests than the clients sent.
TEST(StoreProxyTest, ConcurrentClientsAreCoalescedAndEachGetsItsOwnAnswer) {
  Job job;
  constexpr int kClients = 8;
  constexpr int kRounds = 30;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(job.via_proxy());
  std::vector<std::vector<int64_t>> seen(kClients);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Client& c = *clients[i];
      ++ready;
      while (ready < kClients) std::this_thread::yield();
      for (int r = 0; r < kRounds; ++r) {
        const std::string round = "/round" + std::to_string(r);
        seen[i].push_back(c.add("/counter", 1));
        if (c.add(round, 1) == kClients) c.set(round + "/done", "1");
        c.wait({round + "/done"}, 10s);
        EXPECT_EQ(c.get(round + "/done"), "1");
      }
    });
  }
  for (auto& t : threads) t.join();
  std::set<int64_t> all;
  for (const auto& s : seen) all.insert(s.begin(), s.end());
  EXPECT_EQ(all.size(), size_t{kClients * kRounds});
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kClients * kRounds);
  for (const auto& s : seen) EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));
  const ProxyStats stats = job.proxy->stats();
  std::printf("client requests %llu, upstream %llu, coalesced %llu\n",
              static_cast<unsigned long long>(stats.client_requests),
              static_cast<unsigned long long>(stats.upstream_requests),
              static_cast<unsigned long long>(stats.coalesced));
  EXPECT_GT(stats.coalesced, 0u);
  EXPECT_LT(stats.upstream_requests, stats.client_requests);
}

// Waits on distinct keys that the proxy sends in one turn go as one MULTI_WAIT_TAGGED, each still
// released by its own key. The link is held while 8 clients send ADD of a gate key and a WAIT
// at once: the first ADD to arrive goes alone, the rest gather; when an ADD group's reply comes,
// its clients' WAITs go in that turn.
TEST(StoreProxyTest, DistinctWaitsOfOneTurnGoAsOneRequest) {
  RelayedJob job;
  constexpr int kClients = 8;
  std::vector<std::unique_ptr<RawConn>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<RawConn>(job.proxy.port()));
    clients.back()->send(test::torch2_hello());
  }
  const ProxyStats before = job.proxy.stats();
  job.relay.hold(true);
  for (int i = 0; i < kClients; ++i) {
    clients[i]->send(
        std::string(test::v2(Op::kAdd).str("/gate").i64(1)) +
        std::string(test::v2(Op::kWait).keys({"/key/" + std::to_string(i), "/common"})));
  }
  while (job.proxy.stats().client_requests < before.client_requests + kClients) {
    std::this_thread::sleep_for(1ms);
  }
  job.relay.hold(false);
  std::set<std::string> seen;
  for (auto& c : clients) seen.insert(c->recv(8));
  std::set<std::string> want;
  for (int v = 1; v <= kClients; ++v) want.insert(i64_bytes(v));
  EXPECT_EQ(seen, want);  // distinct, consecutive
  while (job.proxy.stats().client_requests < before.client_requests + 2 * kClients) {
    std::this_thread::sleep_for(1ms);
  }
  auto direct = Client::connect("127.0.0.1", job.server.port());
  direct->set("/common", "1");
  for (int i = 0; i < kClients - 1; ++i) direct->set("/key/" + std::to_string(i), "1");
  for (int i = 0; i < kClients - 1; ++i) EXPECT_EQ(clients[i]->recv(1), std::string(1, '\0'));
  pollfd last{clients[kClients - 1]->fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&last, 1, 100), 0);  // its own key is missing
  direct->set("/key/" + std::to_string(kClients - 1), "1");
  EXPECT_EQ(clients[kClients - 1]->recv(1), std::string(1, '\0'));
  // Two ADDs at most (the first to arrive, then the rest coalesced), each one's clients' WAITs
  // in one request: 4 at most, against 10 or more were each WAIT sent on its own.
  const ProxyStats after = job.proxy.stats();
  EXPECT_LE(after.upstream_requests - before.upstream_requests, 4u);
}

// The link to the store is cut again and again while 8 clients ADD, SET and WAIT through the
// proxy: it resumes its session each time; no ADD is lost or applied twice, every client gets
// distinct, consecutive values, and no client notices.
TEST(StoreProxyTest, CutLinksResumeWithNothingLostOrDoubled) {
  RelayedJob job(15ms);
  ServerThread& server = job.server;
  ProxyThread& proxy = job.proxy;
  Relay& relay = job.relay;
  constexpr int kClients = 8;
  constexpr int kAdds = 400;
  std::vector<std::vector<int64_t>> seen(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto c = Client::connect("127.0.0.1", proxy.port());
      for (int r = 0; r < kAdds; ++r) {
        seen[i].push_back(c->add("/counter", 1));
        if (r % 50 == 0) {
          const std::string key = "/mark/" + std::to_string(r);
          if (c->add(key + "/n", 1) == kClients) c->set(key, "1");
          c->wait({key}, 20s);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  job.stop_cutting();
  std::set<int64_t> all;
  for (const auto& v : seen) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), size_t{kClients * kAdds});
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kClients * kAdds);
  auto direct = Client::connect("127.0.0.1", server.port());
  EXPECT_EQ(direct->add("/counter", 0), kClients * kAdds);
  // The last cut may have come after the last client: the link resumes on its own.
  ProxyStats stats = proxy.stats();
  for (int i = 0; i < 500 && !stats.upstream_connected; ++i) {
    std::this_thread::sleep_for(10ms);
    stats = proxy.stats();
  }
  EXPECT_TRUE(stats.upstream_connected);
  EXPECT_GE(stats.resumes, 3u) << "cuts: " << relay.cuts();
  auto late = Client::connect("127.0.0.1", proxy.port());
  EXPECT_EQ(late->add("/counter", 1), kClients * kAdds + 1);
}

// A link cut while the proxy's write to the store is stuck (the store not reading) fails the
// write before the read: the resumed link parses only what the store sends, nothing left of
// the broken read (its unfilled buffer once stayed, and its zeros parsed as replies).
TEST(StoreProxyTest, ACutDuringAStuckWriteResumesCleanly) {
  RelayedJob job;
  auto c = Client::connect("127.0.0.1", job.proxy.port());
  EXPECT_EQ(c->add("/n", 1), 1);
  job.relay.hold(true);
  const std::string big(4 << 20, 'x');
  for (int i = 0; i < 3; ++i) c->set("/big" + std::to_string(i), big);
  std::this_thread::sleep_for(300ms);  // the proxy's write waits on the held relay
  job.relay.cut();
  job.relay.hold(false);
  EXPECT_EQ(c->add("/n", 1), 2);
  EXPECT_EQ(c->get("/big2"), big);
  const ProxyStats stats = job.proxy.stats();
  EXPECT_TRUE(stats.upstream_connected);
  EXPECT_GE(stats.resumes, 1u);
}

// Every history clients can observe through the proxy is one the store alone could have
// produced (store/testing/linearizability.hpp): random SET/GET/ADD/COMPARE_SET/DELETE/CHECK/
// WAIT (some timing out)/MULTI_GET/MULTI_SET/APPEND/queue operations by 4 clients on 3 keys,
// through a proxy in front of a fresh store; the last seeds with the proxy's link cut every
// 10 ms meanwhile.
TEST(StoreProxyTest, HistoriesThroughTheProxyAreLinearizable) {
  using namespace testing;
  uint64_t coalesced = 0, resumes = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const bool cut = seed > 6;
    RelayedJob job(cut ? 10ms : 0ms);
    ProxyThread& proxy = job.proxy;
    WorkloadOptions wo;
    wo.seed = seed;
    History history;
    try {
      history = run_workload("127.0.0.1", proxy.port(), wo);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
    job.stop_cutting();
    CheckOptions co;
    co.max_states = 1'000'000;
    const CheckResult result = check_linearizable(history, co);
    EXPECT_TRUE(result.ok()) << result.explanation;
    coalesced += proxy.stats().coalesced;
    resumes += proxy.stats().resumes;
  }
  // The histories cover requests answered for several clients at once, and resumed links.
  EXPECT_GT(coalesced, 0u);
  EXPECT_GT(resumes, 0u);
}

// A store that restarted on the same port does not have the proxy's session: it says so, and
// the proxy gives up at once instead of trying for its whole connect timeout.
TEST(StoreProxyTest, ARestartedStoreEndsTheLinkAtOnce) {
  ServerOptions so;
  so.host = "127.0.0.1";
  auto server = std::make_unique<ServerThread>(so);
  so.port = server->port();
  ProxyOptions po;
  po.upstream_host = "127.0.0.1";
  po.upstream_port = server->port();
  po.upstream.connect_timeout = 20s;
  ProxyThread proxy(po);
  auto c = Client::connect("127.0.0.1", proxy.port());
  EXPECT_EQ(c->add("/n", 1), 1);
  server.reset();
  server = std::make_unique<ServerThread>(so);
  const auto started = std::chrono::steady_clock::now();
  EXPECT_THROW(c->add("/n", 1), StoreError);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);
}

// The first connection to the store breaking in the session's handshake (reset right after
// the MUX request, as a busy store host or a network fault can) is tried again within the
// connect timeout, as a broken link is resumed: the proxy is not lost for it.
TEST(StoreProxyTest, AFirstLinkBrokenInItsHandshakeIsTriedAgain) {
  uint16_t port = 0;
  const int listener = loopback_listener(&port);
  ASSERT_GE(listener, 0);
  std::atomic<bool> reset{false};
  std::thread front([&] {  // answers the hello, reads the MUX request, resets the connection
    const int fd = ::accept(listener, nullptr, nullptr);
    char hello[10], mux[17];
    if (fd < 0 || ::recv(fd, hello, sizeof hello, MSG_WAITALL) != sizeof hello ||
        ::send(fd, hello + 6, 4, MSG_NOSIGNAL) != 4 ||
        ::recv(fd, mux, sizeof mux, MSG_WAITALL) != sizeof mux) {
      if (fd >= 0) ::close(fd);
      return;
    }
    linger l{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ::close(fd);
    reset = true;
  });
  ProxyOptions po;
  po.upstream_host = "127.0.0.1";
  po.upstream_port = port;
  po.upstream.connect_timeout = 20s;
  ProxyThread proxy(po);
  front.join();
  ::close(listener);
  ASSERT_TRUE(reset);
  ServerOptions so;  // the store, now on that port
  so.host = "127.0.0.1";
  so.port = port;
  ServerThread server(so);
  ClientOptions co;
  co.connect_timeout = 5s;
  co.timeout = 10s;
  auto c = Client::connect("127.0.0.1", proxy.port(), co);
  EXPECT_EQ(c->add("/n", 1), 1);
  EXPECT_TRUE(proxy.stats().upstream_connected);
  EXPECT_EQ(Client::connect("127.0.0.1", server.port(), co)->add("/n", 0), 1);
}

// A token the store refuses ends the proxy's link at once, with the reason: trying again within
// the connect timeout cannot help.
TEST(StoreProxyTest, ARefusedTokenEndsTheLinkAtOnce) {
  ServerOptions so;
  so.host = "127.0.0.1";
  so.token = "the-right-token";
  ServerThread server(so);
  ProxyOptions po;
  po.upstream_host = "127.0.0.1";
  po.upstream_port = server.port();
  po.upstream.token = "a-wrong-token";
  po.upstream.connect_timeout = 60s;
  const auto [why, took] = until_lost(po);
  EXPECT_LT(took, 10s);
  EXPECT_NE(why.find("token"), std::string::npos) << why;
}

// A proxy that resumes its session on a new connection before the store has seen the old one
// go (a reset both ways, the new connection's bytes handled first) gets its session: the old
// connection is closed, the new one is not refused as if the session were gone.
TEST(StoreProxyTest, AResumeTakesTheSessionFromAConnectionNotYetSeenGone) {
  ServerOptions so;
  so.host = "127.0.0.1";
  ServerThread server(so);
  RawConn first(server.port());
  first.send(test::torch2_hello() + std::string(test::v2(Op::kMux).i64(0).i64(0)));
  const std::string ack = first.recv(17);
  ASSERT_EQ(static_cast<uint8_t>(ack[0]), kExtensionAck);
  const auto framed = [](int64_t v) { return std::string(1, char(kMuxReply)) + i64_bytes(v); };
  first.send(test::v2(Op::kAdd).str("/n").i64(1));
  EXPECT_EQ(first.recv(9), framed(1));
  // The first connection is still open here: its proxy moved on without the store knowing.
  RawConn second(server.port());
  second.send(
      test::torch2_hello() +
      std::string(
          test::v2(Op::kMux).i64(static_cast<int64_t>(wire::load_le(ack.data() + 1, 8))).i64(9)));
  const std::string resumed = second.recv(17);
  ASSERT_EQ(static_cast<uint8_t>(resumed[0]), kExtensionAck);
  EXPECT_EQ(resumed.substr(1, 8), ack.substr(1, 8));
  second.send(test::v2(Op::kAdd).str("/n").i64(1));
  EXPECT_EQ(second.recv(9), framed(2));
  EXPECT_TRUE(first.closed_by_peer(10s));
}

// A store that answers the hello but never the MUX does not hold the proxy: the handshake gets
// what is left of the connect timeout, then the link is lost with the reason, and its clients
// are closed instead of waiting forever.
TEST(StoreProxyTest, AStoreSilentAfterTheHelloEndsTheLinkInTheConnectTimeout) {
  uint16_t port = 0;
  const int listener = loopback_listener(&port);
  ASSERT_GE(listener, 0);
  std::atomic<bool> stop{false};
  std::thread silent([&] {  // answers every hello, then reads and never answers
    std::vector<int> held;
    while (!stop) {
      pollfd p{listener, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int fd = ::accept(listener, nullptr, nullptr);
      char hello[10];
      if (fd >= 0 && ::recv(fd, hello, sizeof hello, MSG_WAITALL) == sizeof hello) {
        (void)::send(fd, hello + 6, 4, MSG_NOSIGNAL);
      }
      if (fd >= 0) held.push_back(fd);
    }
    for (int fd : held) ::close(fd);
  });
  ProxyOptions po;
  po.upstream_host = "127.0.0.1";
  po.upstream_port = port;
  po.upstream.connect_timeout = 1s;
  const auto [why, took] = until_lost(po);
  EXPECT_LT(took, 5s);
  EXPECT_NE(why.find("did not answer MUX"), std::string::npos) << why;
  stop = true;
  silent.join();
  ::close(listener);
}

// A ProxyThread whose proxy lost its store still answers stats(): its thread runs until the
// ProxyThread goes (it used to end with the proxy's last work, and stats() waited for ever).
TEST(StoreProxyTest, AProxyThatLostItsStoreStillGivesItsStats) {
  auto server = std::make_unique<ServerThread>(RelayedJob::loopback());
  ProxyOptions po;
  po.upstream_host = "127.0.0.1";
  po.upstream_port = server->port();
  po.upstream.connect_timeout = 200ms;
  ProxyThread proxy(po);
  for (int i = 0; i < 500 && !proxy.stats().upstream_connected; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(proxy.stats().upstream_connected);
  server.reset();
  std::this_thread::sleep_for(1s);  // the resume's 200 ms are over: the proxy is closed
  EXPECT_FALSE(proxy.stats().upstream_connected);
}

// A proxy closed while it tries to resume (its store is gone) leaves nothing running on the
// io_context it shares (an agent's): the attempt ends with it.
TEST(StoreProxyTest, ClosingEndsAResumeInProgress) {
  ServerOptions so;
  so.host = "127.0.0.1";
  auto server = std::make_unique<ServerThread>(so);
  boost::asio::io_context io;
  ProxyOptions po;
  po.upstream_host = "127.0.0.1";
  po.upstream_port = server->port();
  po.upstream.connect_timeout = 60s;
  auto proxy = std::make_unique<StoreProxy>(io, po);
  for (int i = 0; i < 500 && !proxy->stats().upstream_connected; ++i) io.run_for(10ms);
  ASSERT_TRUE(proxy->stats().upstream_connected);
  server.reset();
  io.run_for(300ms);  // the link broke; it keeps trying
  EXPECT_FALSE(proxy->stats().upstream_connected);
  proxy.reset();
  const auto started = std::chrono::steady_clock::now();
  io.run();  // returns once no work is left
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
}

TEST(StoreProxyTest, Torch1ClientAndCancelledWaits) {
  Job job;
  RawConn t1(job.proxy->port());
  t1.send(test::v1(Op::kAdd).str("/k").i64(2));
  EXPECT_EQ(t1.recv(8), i64_bytes(2));
  t1.send(test::v1(Op::kWatchKey).str("/k"));
  EXPECT_EQ(t1.recv(1), std::string(1, '\x03'));
  // A 1.13 client that gave up on its WAIT moves on: the late 0x00 never comes.
  t1.send(test::v1(Op::kWait).keys({"/w"}));
  std::this_thread::sleep_for(50ms);
  t1.send(test::v1(Op::kAdd).str("/k").i64(1));
  EXPECT_EQ(t1.recv(8), i64_bytes(3));
  job.direct()->set("/w", "1");
  t1.send(test::v1(Op::kGet).str("/w"));
  EXPECT_EQ(t1.recv(9), str_bytes("1"));

  // 2.x CANCEL_WAIT: the wait is dropped (0x01 only); after a release, 0x00 then 0x01.
  RawConn t2(job.proxy->port());
  t2.send(test::torch2_hello() + std::string(test::v2(Op::kWait).keys({"/x"})) +
          std::string(test::v2(Op::kCancelWait)));
  EXPECT_EQ(t2.recv(1), std::string(1, '\x01'));
  t2.send(test::v2(Op::kWait).keys({"/w"}));
  EXPECT_EQ(t2.recv(1), std::string(1, '\x00'));
  t2.send(test::v2(Op::kCancelWait));
  EXPECT_EQ(t2.recv(1), std::string(1, '\x01'));
}

TEST(StoreProxyTest, RefusedAddClosesOnlyItsClient) {
  Job job;
  auto d = job.direct();
  d->set("/text", "abc");
  auto bad = job.via_proxy();
  auto good = job.via_proxy();
  EXPECT_THROW(bad->add("/text", 1), StoreError);
  EXPECT_EQ(good->add("/n", 1), 1);
}

TEST(StoreProxyTest, WillIsAppliedUpstreamWhenTheClientGoes) {
  Job job;
  {
    auto c = job.via_proxy();
    c->set_will("/will", "", "gone");
  }
  auto d = job.direct();
  d->wait({"/will"}, 10s);
  EXPECT_EQ(d->get("/will"), "gone");
}

TEST(StoreProxyTest, AuthenticatesUpstreamAndLosingTheStoreClosesClients) {
  Job job("s3cret-token");
  auto c = job.via_proxy();
  c->set("/a", "1");
  EXPECT_EQ(c->get("/a"), "1");
  job.server.reset();
  EXPECT_THROW(c->wait({"/never"}, 10s), StoreError);
}

}  // namespace
}  // namespace ddprun::store
