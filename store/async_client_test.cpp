// AsyncClient against a real Server on the same io_context (every operation, waits and their
// deadlines, wills, interleaving). Faults are in async_client_faults_test.cpp.
#include "store/async_client_test_util.hpp"

namespace ddprun::store {
namespace {

TEST_F(AsyncClientTest, EveryOpRoundTrips) {
  run([&]() -> awaitable<void> {
    auto c = co_await connect();
    EXPECT_EQ(c->peer(), "127.0.0.1:" + std::to_string(server_.port()));
    co_await c->set("a", "1");
    EXPECT_EQ(co_await c->get("a"), "1"s);
    EXPECT_EQ(co_await c->add("n", 5), 5);
    EXPECT_EQ(co_await c->add("n", -7), -2);
    EXPECT_TRUE(co_await c->check(keys("a", "n")));
    EXPECT_FALSE(co_await c->check(keys("a", "missing")));
    EXPECT_TRUE(co_await c->wait(keys("a", "n"), 1s));  // present: answered at once
    EXPECT_TRUE(co_await c->wait({}, 1s));
    const std::string big(3 << 20, 'v');  // over the read buffer and the 1 MiB growth step
    std::vector<std::pair<std::string, std::string>> kvs{{"x", "1"}, {"y", ""}, {"big", big}};
    co_await c->multi_set(std::move(kvs));
    auto values = co_await c->multi_get(keys("x", "y", "missing", "n"));
    EXPECT_EQ(values, (std::vector<std::string>{"1", "", "", "-2"}));
    EXPECT_TRUE(co_await c->get("big") == big);
    co_await c->set_will("will", "", "gone");
    co_await c->keep_alive(1s, 3);
    EXPECT_EQ(co_await c->add("n", 0), -2);
  });
}

TEST_F(AsyncClientTest, GetOfAMissingKeyIsEmpty) {
  run([&]() -> awaitable<void> {
    auto c = co_await connect();
    EXPECT_EQ(co_await c->get("nothing"), ""s);
    EXPECT_EQ(co_await c->add("n", 1), 1);
  });
}

TEST_F(AsyncClientTest, CompareSetFourCases) {
  run([&]() -> awaitable<void> {
    auto c = co_await connect();
    EXPECT_EQ(co_await c->compare_set("k", "", "v1"), "v1"s);       // absent, "": created
    EXPECT_EQ(co_await c->compare_set("j", "old", "new"), "old"s);  // absent, given: no change
    EXPECT_FALSE(co_await c->check(keys("j")));
    EXPECT_EQ(co_await c->compare_set("k", "v1", "v2"), "v2"s);  // equal: swapped
    EXPECT_EQ(co_await c->compare_set("k", "zz", "v3"), "v2"s);  // different: current value
    EXPECT_EQ(co_await c->get("k"), "v2"s);
  });
}

TEST_F(AsyncClientTest, WaitReturnsTrueWhenAnotherClientSetsTheKeys) {
  run([&]() -> awaitable<void> {
    auto waiter = co_await connect();
    auto setter = co_await connect();
    bool returned = false;
    auto set_both = [&]() -> awaitable<void> {
      co_await setter->set("k1", "x");
      co_await setter->check(keys("k1"));  // a round trip: k1 alone must not release the wait
      EXPECT_FALSE(returned);
      co_await setter->set("k2", "y");
    };
    EXPECT_TRUE(co_await (wait_flagged(*waiter, keys("k1", "k2"), 10s, returned) && set_both()));
    EXPECT_EQ(co_await waiter->get("k2"), "y"s);
  });
}

TEST_F(AsyncClientTest, WaitTimesOutAndTheConnectionStaysUsable) {
  run([&]() -> awaitable<void> {
    auto c = co_await connect();
    auto start = Clock::now();
    EXPECT_FALSE(co_await c->wait(keys("never"), 100ms));
    EXPECT_GE(Clock::now() - start, 100ms);
    EXPECT_LT(Clock::now() - start, 5s);
    co_await c->set("after", "ok");
    EXPECT_EQ(co_await c->get("after"), "ok"s);
    // The parked WAIT was cancelled: its key appearing now sends no stray byte.
    auto other = co_await connect();
    co_await other->set("never", "x");
    EXPECT_EQ(co_await c->add("count", 1), 1);
    EXPECT_TRUE(co_await c->wait(keys("never"), 0ms));  // no deadline
  });
}

TEST_F(AsyncClientTest, WaitRacingItsDeadlineStaysInStep) {
  run([&]() -> awaitable<void> {
    auto waiter = co_await connect();
    auto setter = co_await connect();
    for (int i = 0; i < 20; ++i) {
      const std::string key = "race/" + std::to_string(i);
      auto set_at_deadline = [&]() -> awaitable<void> {
        co_await pause(20ms);
        co_await setter->set(key, "x");
      };
      co_await (waiter->wait(keys(key), 20ms) && set_at_deadline());  // either answer is right
      EXPECT_EQ(co_await waiter->add("count", 1), i + 1);             // replies still line up
      EXPECT_TRUE(co_await waiter->wait(keys(key), 5s));
    }
  });
}

TEST_F(AsyncClientTest, CancelWaitRaceReadsTheReleaseThenTheCancel) {
  FakeStore fake(io_);
  run([&]() -> awaitable<void> {
    auto c = co_await connect_fake(fake, timeouts(5s));
    auto store = [&]() -> awaitable<void> {
      EXPECT_EQ(co_await fake.read(18), client_frames::frame_keys(Op::kWait, keys("k")));
      EXPECT_EQ(co_await fake.read(1), client_frames::frame(Op::kCancelWait));
      co_await fake.write(std::string("\x00\x01", 2));  // released just before the cancel
      EXPECT_EQ(co_await fake.read(18), client_frames::frame_keys(Op::kWait, keys("k")));
      EXPECT_EQ(co_await fake.read(1), client_frames::frame(Op::kCancelWait));
      co_await fake.write("\x01");  // plainly cancelled
      EXPECT_EQ(co_await fake.read(18), client_frames::frame_keys(Op::kCheck, keys("k")));
      co_await fake.write(std::string(1, '\x00'));
    };
    auto client = [&]() -> awaitable<void> {
      EXPECT_TRUE(co_await c->wait(keys("k"), 30ms));
      EXPECT_FALSE(co_await c->wait(keys("k"), 30ms));
      EXPECT_TRUE(co_await c->check(keys("k")));
    };
    co_await (client() && store());
  });
}

TEST_F(AsyncClientTest, CloseWhileAWaitIsParkedEndsItWithClosed) {
  run([&]() -> awaitable<void> {
    auto c = co_await connect();
    auto other = co_await connect();
    auto close_it = [&]() -> awaitable<void> {
      co_await other->check(keys("x"));  // a round trip: the wait is parked by now
      c->close();
    };
    EXPECT_EQ(co_await (kind_of(c->wait(keys("never"), 0ms)) && close_it()), Kind::kClosed);
    EXPECT_EQ(co_await kind_of(c->set("k", "v")), Kind::kClosed);
  });
}

TEST_F(AsyncClientTest, TheWillAppliesWhenTheClientIsDestroyed) {
  run([&]() -> awaitable<void> {
    auto watcher = co_await connect();
    auto a = co_await connect();
    co_await a->keep_alive(1s, 3);
    co_await a->set_will("/job/change", "", "dead:a");
    co_await a->set("/job/x", "1");  // the connection keeps working
    auto end_a = [&]() -> awaitable<void> {
      co_await a->add("/job/n", 1);  // a round trip first: the watcher's WAIT is likely parked
      a.reset();
    };
    auto watch = watcher->wait(keys("/job/change"), 10s);
    EXPECT_TRUE(co_await (std::move(watch) && end_a()));
    EXPECT_EQ(co_await watcher->get("/job/change"), "dead:a"s);
    // A cleared will does nothing; the next one, set after it, shows b's end was handled.
    auto b = co_await connect();
    co_await b->set_will("/job/gone", "", "dead:b");
    co_await b->set_will("", "", "");
    co_await b->set_will("/job/b-ended", "", "yes");
    b.reset();
    EXPECT_TRUE(co_await watcher->wait(keys("/job/b-ended"), 10s));
    EXPECT_FALSE(co_await watcher->check(keys("/job/gone")));
  });
}

TEST_F(AsyncClientTest, DestroyingTheClientMidWaitEndsTheWaitAndAppliesTheWill) {
  run([&]() -> awaitable<void> {
    auto c = co_await connect();
    auto watcher = co_await connect();
    co_await c->set_will("/dead", "", "c");
    auto destroy = [&]() -> awaitable<void> {
      co_await watcher->check(keys("x"));
      c.reset();  // the parked wait still holds the connection's state
    };
    auto parked = c->wait(keys("never"), 0ms);
    EXPECT_EQ(co_await (kind_of(std::move(parked)) && destroy()), Kind::kClosed);
    EXPECT_TRUE(co_await watcher->wait(keys("/dead"), 10s));
  });
}

TEST_F(AsyncClientTest, KeepAliveIsAccepted) {
  run([&]() -> awaitable<void> {
    auto c = co_await connect();
    co_await c->keep_alive(2s, 5);
    bool rejected = false;
    try {
      co_await c->keep_alive(0ms, 3);
    } catch (const std::invalid_argument&) {
      rejected = true;
    }
    EXPECT_TRUE(rejected);
    EXPECT_EQ(co_await c->add("n", 2), 2);  // neither call hurt the connection
  });
}

TEST_F(AsyncClientTest, ASecondOperationWhileOneIsInFlightIsRefused) {
  run([&]() -> awaitable<void> {
    auto c = co_await connect();
    auto setter = co_await connect();
    auto meddle = [&]() -> awaitable<void> {
      co_await setter->check(keys("x"));  // the wait is in flight by now
      EXPECT_EQ(co_await kind_of(c->add("n", 1)), Kind::kProtocol);
      co_await setter->set("go", "1");
    };
    EXPECT_TRUE(co_await (c->wait(keys("go"), 10s) && meddle()));
    EXPECT_EQ(co_await c->add("n", 1), 1);  // the refused add never reached the store
  });
}

TEST_F(AsyncClientTest, ClientsOnOneIoContextInterleave) {
  run([&]() -> awaitable<void> {
    auto a = co_await connect();
    auto b = co_await connect();
    auto c = co_await connect();
    bool a_returned = false;
    auto others = [&]() -> awaitable<void> {
      for (int i = 1; i <= 50; ++i) EXPECT_EQ(co_await b->add("n", 1), i);
      EXPECT_FALSE(co_await c->wait(keys("never"), 50ms));  // a second parked wait, timing out
      EXPECT_FALSE(a_returned);
      co_await b->set("go", "1");
    };
    EXPECT_TRUE(co_await (wait_flagged(*a, keys("go"), 10s, a_returned) && others()));
  });
}

TEST(AsyncClientIpv6Test, ConnectsToIpv6Loopback) {
  asio::io_context io;
  std::unique_ptr<Server> server;
  try {
    server = std::make_unique<Server>(io, listen_on("::1"));
  } catch (const std::exception& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  run_on(io, [&]() -> awaitable<void> {
    ClientOptions options;
    auto c = co_await AsyncClient::connect(io.get_executor(), "::1", server->port(), options);
    EXPECT_EQ(c->peer(), "[::1]:" + std::to_string(server->port()));
    co_await c->set("k", "v6");
    EXPECT_EQ(co_await c->get("k"), "v6"s);
  }());
}

TEST(AsyncClientThreadTest, WorksAgainstAServerOnAnotherThread) {
  ServerThread server(listen_on("127.0.0.1"));
  asio::io_context io;
  run_on(io, [&]() -> awaitable<void> {
    ClientOptions options;
    auto c = co_await AsyncClient::connect(io.get_executor(), "127.0.0.1", server.port(), options);
    EXPECT_EQ(co_await c->add("n", 3), 3);
    EXPECT_TRUE(co_await c->wait(keys("n"), 1s));
  }());
}

}  // namespace
}  // namespace ddprun::store
