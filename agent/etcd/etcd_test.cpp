// EtcdClient and EtcdStore against a real etcd (Debian's etcd-server, started here on free
// loopback ports with its data in a temporary directory), plus a fake member that answers
// garbage, to see a malformed reply close only that connection.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <future>
#include <thread>

#include "agent/etcd/etcd_client.hpp"
#include "agent/etcd/etcd_test_util.hpp"
#include "agent/etcd/lease_revoke.hpp"
#include "agent/rendezvous/etcd_store.hpp"
#include "store/client.hpp"
#include "store/sys/temp_dir.hpp"

namespace ddprun {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using agent::EtcdStore;
using agent::EtcdStoreOptions;
using etcd::Clock;
using test::Etcd;
using test::EtcdTest;
using test::free_port;
using test::run;

TEST(EtcdText, Base64RoundTripsEveryByte) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n <= 5; ++n) {
    EXPECT_EQ(etcd::base64_decode(etcd::base64_encode(all.substr(0, n))), all.substr(0, n));
  }
  EXPECT_EQ(etcd::base64_decode(etcd::base64_encode(all)), all);
  EXPECT_EQ(etcd::base64_encode("foo"), "Zm9v");
  EXPECT_EQ(etcd::base64_encode("fo"), "Zm8=");
  EXPECT_THROW(etcd::base64_decode("Zm9v!"), std::invalid_argument);
}

TEST(EtcdText, EndpointsParseWithDefaultPortSchemesAndIpv6) {
  auto e = etcd::parse_endpoints("h1,h2:2380,[::1]:2381,http://h3:4,https://10.0.0.1/");
  ASSERT_EQ(e.size(), 5u);
  EXPECT_EQ(e[0].host, "h1");
  EXPECT_EQ(e[0].port, 2379);
  EXPECT_EQ(e[1].port, 2380);
  EXPECT_EQ(e[2].host, "::1");
  EXPECT_EQ(e[2].port, 2381);
  EXPECT_EQ(e[3].host, "h3");
  EXPECT_EQ(e[4].host, "10.0.0.1");
  EXPECT_EQ(etcd::endpoints_text(e), "h1:2379, h2:2380, [::1]:2381, h3:4, 10.0.0.1:2379");
  EXPECT_THROW(etcd::parse_endpoints("h1,,h2"), std::invalid_argument);
  EXPECT_THROW(etcd::parse_endpoints("h:0"), std::invalid_argument);
  EXPECT_THROW(etcd::parse_endpoints("h:x"), std::invalid_argument);
  EXPECT_EQ(etcd::prefix_end("/a/"), "/a0");
  EXPECT_EQ(etcd::prefix_end(std::string("a\xff", 2)), "b");
}

TEST_F(EtcdTest, AddCompareSetAndReadsKeepTheStoreSemantics) {
  run<bool>([this](asio::io_context& io) -> asio::awaitable<bool> {
    EtcdStore s(io.get_executor(), store_options("/t1/"));
    EXPECT_EQ(co_await s.add("/t1/n", 0), 0);
    EXPECT_EQ(co_await s.add("/t1/n", 5), 5);
    EXPECT_EQ(co_await s.add("/t1/n", -2), 3);
    EXPECT_EQ(co_await s.add("/t1/n", 0), 3);
    EXPECT_EQ(co_await s.compare_set("/t1/c", "", "a"), "a");  // absent matches ""
    EXPECT_EQ(co_await s.compare_set("/t1/c", "", "b"), "a");  // present: unchanged
    EXPECT_EQ(co_await s.compare_set("/t1/c", "a", "b"), "b");
    EXPECT_EQ(co_await s.compare_set("/t1/d", "x", "y"), "x");  // absent, expected not ""
    std::vector<std::string> cd{"/t1/c", "/t1/d"};
    EXPECT_FALSE(co_await s.check(cd));
    std::vector<std::pair<std::string, std::string>> kvs{{"/t1/d", "1"},
                                                         {"/t1/e", std::string("\0\xff", 2)}};
    co_await s.multi_set(kvs);
    EXPECT_TRUE(co_await s.check(cd));
    std::vector<std::string> keys{"/t1/c", "/t1/e", "/t1/none"};
    auto values = co_await s.multi_get(keys);
    EXPECT_EQ(values, (std::vector<std::string>{"b", std::string("\0\xff", 2), ""}));
    std::vector<std::string> many;
    for (int i = 0; i < 300; ++i) many.push_back("/t1/m/" + std::to_string(i));
    std::vector<std::pair<std::string, std::string>> mkv;
    for (auto& k : many) mkv.emplace_back(k, k);
    co_await s.multi_set(mkv);
    auto got = co_await s.multi_get(many);
    EXPECT_EQ(got, many);  // several transactions of at most 128
    co_return true;
  });
}

TEST_F(EtcdTest, ConcurrentAddsFromManyClientsSumExactly) {
  run<bool>([this](asio::io_context& io) -> asio::awaitable<bool> {
    constexpr int kClients = 16;
    std::vector<std::unique_ptr<EtcdStore>> stores;
    for (int i = 0; i < kClients; ++i) {
      stores.push_back(std::make_unique<EtcdStore>(io.get_executor(), store_options("/t2/")));
    }
    std::vector<int64_t> got;
    int done = 0;
    for (auto& s : stores) {
      asio::co_spawn(
          io,
          [&, st = s.get()]() -> asio::awaitable<void> {
            got.push_back(co_await st->add("/t2/join", 1));
            ++done;
          },
          asio::detached);
    }
    asio::steady_timer t(io);
    while (done < kClients) {
      t.expires_after(10ms);
      co_await t.async_wait(asio::use_awaitable);
    }
    std::sort(got.begin(), got.end());
    for (int i = 0; i < kClients; ++i) EXPECT_EQ(got[i], i + 1);
    co_return true;
  });
}

TEST_F(EtcdTest, WaitTimesOutThenWakesOnAnotherClientsWrite) {
  run<bool>([this](asio::io_context& io) -> asio::awaitable<bool> {
    EtcdStore a(io.get_executor(), store_options("/t3/"));
    EtcdStore b(io.get_executor(), store_options("/t3/"));
    std::vector<std::string> keys{"/t3/x", "/t3/y"};
    auto t0 = Clock::now();
    EXPECT_FALSE(co_await a.wait(keys, 300ms));
    EXPECT_GE(Clock::now() - t0, 300ms);
    std::vector<std::pair<std::string, std::string>> x{{"/t3/x", "1"}};
    co_await b.multi_set(x);
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          asio::steady_timer t(io);
          t.expires_after(200ms);
          co_await t.async_wait(asio::use_awaitable);
          std::string key = "/t3/y", expected, desired = "2";
          co_await b.compare_set(key, expected, desired);
        },
        asio::detached);
    t0 = Clock::now();
    EXPECT_TRUE(co_await a.wait(keys, 10s));
    EXPECT_LT(Clock::now() - t0, 5s);
    co_return true;
  });
}

TEST_F(EtcdTest, WillAppliesWhenTheLeaseIsRevokedOrExpires) {
  run<bool>([this](asio::io_context& io) -> asio::awaitable<bool> {
    EtcdStore watcher(io.get_executor(), store_options("/t4/"));
    std::vector<std::string> none{"/t4/none"};
    co_await watcher.check(none);  // wills are applied from a client's first operation on
    int64_t seen_lease = -1;
    auto o = store_options("/t4/");
    o.on_lease = [&](int64_t l) { seen_lease = l; };
    {
      EtcdStore dying(io.get_executor(), o);
      co_await dying.set_will("/t4/r1/change", "", "dead:one");
      // An add's marker key shares the lease: the revocation deletes both in one revision.
      EXPECT_EQ(co_await dying.add("/t4/joined", 1), 1);
      EXPECT_GT(dying.lease(), 0);
      EXPECT_EQ(seen_lease, dying.lease());
      co_await dying.end(2s);
      EXPECT_EQ(seen_lease, 0);
    }
    // The watcher was not waiting when it happened: its next wait applies the will.
    std::vector<std::string> k1{"/t4/r1/change"};
    auto t0 = Clock::now();
    EXPECT_TRUE(co_await watcher.wait(k1, 5s));
    EXPECT_LT(Clock::now() - t0, 1s);
    EXPECT_EQ((co_await watcher.multi_get(k1))[0], "dead:one");

    // A vanished host: nobody revokes; the lease expires after its TTL (2 s here).
    EtcdStore gone(io.get_executor(), store_options("/t4/"));
    co_await gone.set_will("/t4/r2/change", "", "dead:two");
    gone.abandon();
    std::vector<std::string> k2{"/t4/r2/change"};
    t0 = Clock::now();
    EXPECT_TRUE(co_await watcher.wait(k2, 10s));
    EXPECT_LT(Clock::now() - t0, 6s);
    EXPECT_EQ((co_await watcher.multi_get(k2))[0], "dead:two");

    // A cleared will does nothing when its lease ends; a will does not overwrite a value.
    EtcdStore cleared(io.get_executor(), store_options("/t4/"));
    co_await cleared.set_will("/t4/r3/change", "", "dead:three");
    co_await cleared.set_will("", "", "");
    co_await cleared.end(2s);
    std::vector<std::string> k3{"/t4/r3/change"};
    EXPECT_FALSE(co_await watcher.wait(k3, 500ms));
    co_return true;
  });
}

TEST_F(EtcdTest, KeepAliveHoldsTheLeasePastItsTtl) {
  run<bool>([this](asio::io_context& io) -> asio::awaitable<bool> {
    EtcdStore alive(io.get_executor(), store_options("/t5/"));
    EtcdStore watcher(io.get_executor(), store_options("/t5/"));
    co_await alive.set_will("/t5/change", "", "dead");
    std::vector<std::string> k{"/t5/change"};
    EXPECT_FALSE(co_await watcher.wait(k, 4s));  // twice the TTL
    alive.close();
    co_return true;
  });
}

TEST_F(EtcdTest, GuardianRequestRevokesTheLease) {
  run<bool>([this](asio::io_context& io) -> asio::awaitable<bool> {
    EtcdStore watcher(io.get_executor(), store_options("/t6/"));
    std::vector<std::string> none{"/t6/none"};
    co_await watcher.check(none);
    auto o = store_options("/t6/");
    o.lease_ttl = 30s;
    EtcdStore killed(io.get_executor(), o);
    co_await killed.set_will("/t6/change", "", "dead:killed");
    const std::string request = etcd::revoke_request(o.client, killed.lease());
    killed.abandon();
    std::thread guardian([&] { EXPECT_TRUE(etcd::revoke_now(request, 2s)); });
    std::vector<std::string> k{"/t6/change"};
    auto t0 = Clock::now();
    const bool woke = co_await watcher.wait(k, 10s);
    guardian.join();
    EXPECT_TRUE(woke);
    EXPECT_LT(Clock::now() - t0, 3s);  // not the 30 s TTL
    co_return true;
  });
}

TEST_F(EtcdTest, FailsOverPastDeadAndGarbageMembers) {
  // A member that accepts and answers garbage, then one that refuses; etcd is third.
  asio::io_context fake_io;
  asio::ip::tcp::acceptor fake(fake_io, {asio::ip::make_address("127.0.0.1"), 0});
  const uint16_t fake_port = fake.local_endpoint().port();
  std::atomic<int> garbage_served{0};
  std::thread fake_thread([&] {
    asio::co_spawn(
        fake_io,
        [&]() -> asio::awaitable<void> {
          for (;;) {
            auto sock = co_await fake.async_accept(asio::use_awaitable);
            std::string junk = "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{\"kvs\":[[";
            co_await asio::async_write(sock, asio::buffer(junk), asio::use_awaitable);
            ++garbage_served;
          }
        },
        asio::detached);
    fake_io.run_for(30s);
  });
  const uint16_t dead = free_port();
  etcd::Options o = etcd_->options();
  o.endpoints = {{"127.0.0.1", fake_port}, {"127.0.0.1", dead}, {"127.0.0.1", etcd_->port()}};
  std::vector<std::string> outages;
  o.on_outage = [&](const std::string& l) { outages.push_back(l); };
  run<bool>([&](asio::io_context& io) -> asio::awaitable<bool> {
    etcd::EtcdClient c(io.get_executor(), o);
    auto r = co_await c.range("/t7/none", "", Clock::now() + 10s);
    EXPECT_TRUE(r.kvs.empty());
    EXPECT_GT(r.revision, 0);
    co_return true;
  });
  EXPECT_GE(garbage_served.load(), 1);
  EXPECT_TRUE(outages.empty());  // one member answered within the first round

  // Nothing answers: kUnavailable within the deadline, naming the endpoints.
  o.endpoints = {{"127.0.0.1", dead}};
  auto t0 = Clock::now();
  try {
    run<bool>([&](asio::io_context& io) -> asio::awaitable<bool> {
      etcd::EtcdClient c(io.get_executor(), o);
      co_await c.range("k", "", Clock::now() + 1s);
      co_return true;
    });
    ADD_FAILURE() << "no error";
  } catch (const etcd::EtcdError& e) {
    EXPECT_EQ(e.kind(), etcd::EtcdError::Kind::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(dead)), std::string::npos)
        << e.what();
  }
  EXPECT_LT(Clock::now() - t0, 3s);
  EXPECT_FALSE(outages.empty());
  fake_io.stop();
  fake_thread.join();
}

TEST_F(EtcdTest, StoreErrorsNameTheProblem) {
  auto o = store_options("/t8/");
  o.client.endpoints = {{"127.0.0.1", free_port()}};
  o.op_timeout = 500ms;
  try {
    run<bool>([&](asio::io_context& io) -> asio::awaitable<bool> {
      EtcdStore s(io.get_executor(), o);
      co_await s.add("/t8/x", 1);
      co_return true;
    });
    ADD_FAILURE() << "no error";
  } catch (const store::StoreError& e) {
    EXPECT_EQ(e.kind(), store::StoreError::Kind::kConnect);
    EXPECT_NE(std::string(e.what()).find("no etcd member answered"), std::string::npos) << e.what();
  }
  // close() ends a wait in progress.
  run<bool>([this](asio::io_context& io) -> asio::awaitable<bool> {
    EtcdStore s(io.get_executor(), store_options("/t8/"));
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          asio::steady_timer t(io);
          t.expires_after(200ms);
          co_await t.async_wait(asio::use_awaitable);
          s.close();
        },
        asio::detached);
    std::vector<std::string> k{"/t8/never"};
    try {
      co_await s.wait(k, 0ms);
      ADD_FAILURE() << "wait returned";
    } catch (const store::StoreError& e) {
      EXPECT_EQ(e.kind(), store::StoreError::Kind::kClosed) << e.what();
    }
    co_return true;
  });
}

}  // namespace
}  // namespace ddprun
