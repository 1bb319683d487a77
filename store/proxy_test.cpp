// StoreProxy: every op through the proxy gives what the store gives, coalescing answers each
// client as if its request had been sent alone, waits and their cancellation, 1.13 clients,
// a last will, and the upstream link's loss.
#include "store/proxy.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <set>
#include <thread>
#include <vector>

#include "store/client.hpp"
#include "store/raw_client_test_util.hpp"
#include "store/server.hpp"
#include "store/test_frames.hpp"

namespace ddprun::store {
namespace {

using namespace std::chrono_literals;
using test::i64_bytes;
using test::RawConn;
using test::str_bytes;

struct Job {
  explicit Job(std::string secret = "") : token(secret) {
    ServerOptions so;
    so.host = "127.0.0.1";
    so.token = secret;
    server = std::make_unique<ServerThread>(so);
    ProxyOptions po;
    po.upstream_host = "127.0.0.1";
    po.upstream_port = server->port();
    po.upstream.token = secret;
    po.upstream.connect_timeout = 5s;
    proxy = std::make_unique<ProxyThread>(po);
  }
  std::unique_ptr<Client> direct() {
    ClientOptions o;
    o.token = token;
    return Client::connect("127.0.0.1", server->port(), o);
  }
  std::unique_ptr<Client> via_proxy() { return Client::connect("127.0.0.1", proxy->port()); }
  std::string token;
  std::unique_ptr<ServerThread> server;
  std::unique_ptr<ProxyThread> proxy;
};

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
