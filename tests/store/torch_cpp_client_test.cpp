// LibTorch 1.13's own C++ client, c10d::TCPStore (Debian's libtorch), against our server:
// every op it has, including watchKey, multi-client waits, PrefixStore and the timed-out
// wait that desyncs torch 1.13's own server.
#include <gtest/gtest.h>

#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "store/client.hpp"
#include "store/server.hpp"

namespace {

using namespace std::chrono_literals;
using Bytes = std::vector<uint8_t>;

Bytes bytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

class TorchClientTest : public ::testing::Test {
 protected:
  static ddprun::store::ServerOptions loopback() {
    ddprun::store::ServerOptions o;
    o.host = "127.0.0.1";
    return o;
  }
  c10::intrusive_ptr<c10d::TCPStore> client(std::chrono::milliseconds timeout = 20s,
                                            c10::optional<size_t> workers = c10::nullopt) {
    c10d::TCPStoreOptions opts;
    opts.port = server_.port();
    opts.isServer = false;
    opts.numWorkers = workers;
    opts.waitWorkers = workers.has_value();
    opts.timeout = timeout;
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
  }
  ddprun::store::ServerThread server_{loopback()};
};

TEST_F(TorchClientTest, EveryOp) {
  auto c = client(20s, 4);  // joins with ADD init/ as a non-server client does
  c->set("a", bytes("1"));
  EXPECT_EQ(c->get("a"), bytes("1"));
  EXPECT_EQ(c->add("n", 3), 3);
  EXPECT_EQ(c->add("n", -5), -2);
  EXPECT_EQ(c->compareSet("cas", {}, bytes("v1")), bytes("v1"));
  EXPECT_EQ(c->compareSet("none", bytes("x"), bytes("y")), bytes("x"));
  EXPECT_EQ(c->compareSet("cas", bytes("v1"), bytes("v2")), bytes("v2"));
  EXPECT_EQ(c->compareSet("cas", bytes("zz"), bytes("v3")), bytes("v2"));
  EXPECT_TRUE(c->check({"a", "n", "cas"}));
  EXPECT_FALSE(c->check({"a", "none"}));
  EXPECT_EQ(c->getNumKeys(), 4);  // a, n, cas and init/
  EXPECT_TRUE(c->deleteKey("a"));
  EXPECT_FALSE(c->deleteKey("a"));
  EXPECT_EQ(c->getNumKeys(), 3);
  c->wait({"n", "cas"});
  c->wait({"n"}, 1s);
  // watchKey is acknowledged (the call blocks until it is); notifications are not sent.
  c->watchKey("n", [](c10::optional<std::string>, c10::optional<std::string>) {});
  EXPECT_EQ(c->add("n", 0), -2);
}

TEST_F(TorchClientTest, WaitReleasedByAnotherClient) {
  auto waiter = client();
  auto setter = client();
  std::thread t([&] { EXPECT_EQ(waiter->get("late"), bytes("value")); });
  setter->set("late", bytes("value"));
  t.join();
}

TEST_F(TorchClientTest, ConnectionSurvivesATimedOutWait) {
  auto c = client();
  auto other = client();
  EXPECT_THROW(c->wait({"never"}, 200ms), c10::Error);
  EXPECT_EQ(c->add("counter", 1), 1);  // the next request cancels the wait on the server
  other->set("never", bytes("now"));
  EXPECT_EQ(other->add("counter", 0), 1);
  EXPECT_EQ(c->add("counter", 1), 2);  // torch 1.13's server would have desynced here
  EXPECT_EQ(c->get("never"), bytes("now"));
}

TEST_F(TorchClientTest, PrefixStoreNamespaces) {
  auto base = client();
  c10d::PrefixStore ps("job7", base);
  ps.set("k", bytes("v"));
  EXPECT_EQ(ps.get("k"), bytes("v"));
  EXPECT_EQ(base->get("job7/k"), bytes("v"));
  EXPECT_EQ(ps.add("ctr", 2), 2);
}

TEST_F(TorchClientTest, ManyClientsJoin) {
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&] {
      auto c = client(20s, 16);
      c->set("rank" + std::to_string(c->add("ranks", 1)), bytes("x"));
    });
  }
  for (auto& t : threads) t.join();
  auto c = client();
  for (int r = 1; r <= 16; ++r) EXPECT_TRUE(c->check({"rank" + std::to_string(r)}));
  // torch prefixes user keys with "/" but not its join counter; our raw client sees both.
  auto raw = ddprun::store::Client::connect("127.0.0.1", server_.port());
  EXPECT_EQ(raw->get("init/"), "16");
  EXPECT_EQ(raw->get("/ranks"), "16");
}

}  // namespace
