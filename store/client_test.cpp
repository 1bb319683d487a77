// Our Client against our ServerThread: every op, deadlines, interrupt, connect retry.
#include "store/client.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "store/server.hpp"

namespace ddprun::store {
namespace {

using namespace std::chrono_literals;

ServerOptions loopback(uint16_t port = 0) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  return options;
}

ClientOptions connect_within(std::chrono::milliseconds timeout) {
  ClientOptions options;
  options.connect_timeout = timeout;
  return options;
}

class ClientTest : public ::testing::Test {
 protected:
  ServerThread server_{loopback()};
  std::unique_ptr<Client> connect(ClientOptions options = {}) {
    return Client::connect("127.0.0.1", server_.port(), options);
  }
};

TEST_F(ClientTest, KeyValueOps) {
  auto c = connect();
  c->set("a", "1");
  EXPECT_EQ(c->get("a"), "1");
  EXPECT_EQ(c->add("n", 5), 5);
  EXPECT_EQ(c->add("n", -7), -2);
  EXPECT_EQ(c->get("n"), "-2");
  EXPECT_TRUE(c->check({"a", "n"}));
  EXPECT_FALSE(c->check({"a", "missing"}));
  EXPECT_EQ(c->num_keys(), 2);
  c->append("a", "23");
  EXPECT_EQ(c->get("a"), "123");
  EXPECT_TRUE(c->delete_key("a"));
  EXPECT_FALSE(c->delete_key("a"));
  EXPECT_EQ(c->num_keys(), 1);
  c->multi_set({{"x", "1"}, {"y", ""}});
  EXPECT_EQ(c->multi_get({"x", "y"}), (std::vector<std::string>{"1", ""}));
  auto keys = c->list_keys();
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"n", "x", "y"}));
  c->ping();
}

TEST_F(ClientTest, CompareSetFourCases) {
  auto c = connect();
  EXPECT_EQ(c->compare_set("k", "", "v1"), "v1");       // absent, expected empty: created
  EXPECT_EQ(c->compare_set("j", "old", "new"), "old");  // absent, expected given: no change
  EXPECT_FALSE(c->check({"j"}));
  EXPECT_EQ(c->compare_set("k", "v1", "v2"), "v2");  // equal: swapped
  EXPECT_EQ(c->compare_set("k", "zz", "v3"), "v2");  // different: current value
  EXPECT_EQ(c->get("k"), "v2");
}

TEST_F(ClientTest, Queues) {
  auto c = connect();
  EXPECT_EQ(c->queue_pop("q"), std::nullopt);
  c->queue_push("q", "a");
  c->queue_push("q", "b");
  EXPECT_EQ(c->queue_len("q"), 2);
  EXPECT_EQ(c->queue_pop("q"), "a");
  EXPECT_EQ(c->queue_pop("q"), "b");
  EXPECT_EQ(c->queue_len("q"), 0);
  EXPECT_EQ(c->num_keys(), 0);  // queues are kept apart from the key map
}

TEST_F(ClientTest, WaitIsReleasedBySetFromAnotherClient) {
  auto waiter = connect();
  auto setter = connect();
  std::thread t([&] { waiter->wait({"k1", "k2"}, 20s); });
  setter->set("k1", "x");
  setter->set("k2", "y");
  t.join();
  EXPECT_EQ(waiter->get("k2"), "y");
}

TEST_F(ClientTest, WaitTimeoutCancelsAndConnectionStaysUsable) {
  auto c = connect();
  try {
    c->wait({"never"}, 50ms);
    FAIL() << "no timeout";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreError::Kind::kTimeout);
  }
  c->set("after", "ok");
  EXPECT_EQ(c->get("after"), "ok");
  try {
    c->get("never", 20ms);
    FAIL() << "no timeout";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreError::Kind::kTimeout);
  }
  EXPECT_EQ(c->add("cnt", 1), 1);
}

TEST_F(ClientTest, BarrierReleasesAllRanks) {
  constexpr int kRanks = 4;
  std::vector<std::thread> ranks;
  std::atomic<int> done{0};
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&] {
      auto c = connect();
      c->barrier("bar", kRanks, 20s);
      ++done;
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(done, kRanks);
  EXPECT_EQ(connect()->get("bar"), "4");
}

TEST_F(ClientTest, BarrierTimeout) {
  auto c = connect();
  try {
    c->barrier("lonely", 2, 30ms);
    FAIL() << "no timeout";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreError::Kind::kTimeout);
  }
  c->ping();
}

TEST_F(ClientTest, InterruptUnblocksAWait) {
  auto c = connect();
  std::thread t([&] { std::this_thread::sleep_for(50ms), c->interrupt(); });
  try {
    c->wait({"never"}, 60s);
    FAIL() << "not interrupted";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreError::Kind::kClosed);
  }
  t.join();
  EXPECT_THROW(c->ping(), StoreError);
}

TEST_F(ClientTest, LastWillFiresWhenTheConnectionCloses) {
  auto watcher = connect();
  auto a = connect();
  a->keep_alive(1s, 3);
  a->set_will("/job/change", "", "dead:a");
  a->set("/job/x", "1");  // the connection keeps working
  std::thread closer([&] {
    std::this_thread::sleep_for(20ms);
    a.reset();  // closed: the server applies the will
  });
  watcher->wait({"/job/change"}, 10s);
  closer.join();
  EXPECT_EQ(watcher->get("/job/change"), "dead:a");
  // A will is a compare-and-set: the first event stays.
  auto b = connect();
  b->set_will("/job/change", "", "dead:b");
  b.reset();
  auto c = connect();
  c->set_will("/job/gone", "", "dead:c");
  c->set_will("", "", "");  // cleared
  c.reset();
  EXPECT_EQ(watcher->get("/job/change"), "dead:a");
  watcher->ping();  // the server has handled c's close by now (one connection, in order)
  EXPECT_FALSE(watcher->check({"/job/gone"}));
}

TEST_F(ClientTest, LastWillFiresWhenTheProcessIsKilled) {
  auto watcher = connect();
  pid_t child = ::fork();
  if (child == 0) {
    auto a = connect();
    a->set_will("/killed", "", "yes");
    a->set("/ready", "1");
    ::pause();  // SIGKILLed here: the kernel closes the socket
    ::_exit(0);
  }
  watcher->wait({"/ready"}, 10s);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  watcher->wait({"/killed"}, 10s);
  EXPECT_EQ(watcher->get("/killed"), "yes");
}

TEST(ClientConnectTest, RetriesUntilTheServerListens) {
  // Pick a free port, then start the server on it a little later.
  uint16_t port;
  {
    ServerThread probe(loopback());
    port = probe.port();
  }
  std::unique_ptr<ServerThread> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(200ms);
    server = std::make_unique<ServerThread>(loopback(port));
  });
  auto c = Client::connect("127.0.0.1", port, connect_within(20s));
  starter.join();
  c->set("k", "v");
  EXPECT_EQ(c->get("k"), "v");
}

TEST(ClientConnectTest, GivesUpAtTheConnectTimeout) {
  uint16_t port;
  {
    ServerThread probe(loopback());
    port = probe.port();
  }
  try {
    Client::connect("127.0.0.1", port, connect_within(100ms));
    FAIL() << "connected to nothing";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreError::Kind::kConnect);
    EXPECT_NE(std::string(e.what()).find("Connection refused"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddprun::store
