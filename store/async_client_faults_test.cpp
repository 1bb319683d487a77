// AsyncClient against stores that fail: nothing listening, never answering, closing, lying.
#include "store/async_client_test_util.hpp"

namespace ddprun::store {
namespace {

// The same fixture under its own name (each test file has its own copy of the fixture class).
class AsyncClientFaultTest : public AsyncClientTest {};

TEST_F(AsyncClientFaultTest, ConnectRetriesUntilTheServerListens) {
  const uint16_t port = reserve_port(io_);
  const auto start = Clock::now();
  std::unique_ptr<Server> late;
  asio::steady_timer starter(io_, 200ms);
  starter.async_wait([&](const boost::system::error_code& ec) {
    if (!ec) late = std::make_unique<Server>(io_, listen_on("127.0.0.1", port));
  });
  run([&]() -> awaitable<void> {
    auto c = co_await AsyncClient::connect(io_.get_executor(), "127.0.0.1", port, timeouts(10s));
    EXPECT_GE(Clock::now() - start, 200ms);
    co_await c->set("k", "v");
    EXPECT_EQ(co_await c->get("k"), "v"s);
  });
}

TEST_F(AsyncClientFaultTest, ConnectGivesUpAtTheConnectTimeoutNamingHostAndPort) {
  const uint16_t port = reserve_port(io_);
  run([&]() -> awaitable<void> {
    auto start = Clock::now();
    StoreError e = co_await error_of(
        AsyncClient::connect(io_.get_executor(), "127.0.0.1", port, timeouts(300ms)));
    EXPECT_EQ(e.kind(), Kind::kConnect);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("Connection refused"), std::string::npos) << e.what();
    EXPECT_GE(Clock::now() - start, 300ms);
    EXPECT_LT(Clock::now() - start, 5s);
  });
}

TEST_F(AsyncClientFaultTest, ConnectAttemptsAreBoundedByTheCallTimeout) {
  FakeStore silent(io_);  // accepts, never answers the PING
  run([&]() -> awaitable<void> {
    auto attempt = AsyncClient::connect(io_.get_executor(), "127.0.0.1", silent.port(),
                                        timeouts(700ms, 100ms));
    auto outcome = co_await (error_of(std::move(attempt)) || silent.accept_silently());
    StoreError e = std::get<0>(outcome);
    EXPECT_EQ(e.kind(), Kind::kConnect);
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
    EXPECT_GE(silent.held(), 2u);  // 100 ms per attempt: the budget allowed several
  });
}

TEST_F(AsyncClientFaultTest, AStoreThatNeverAnswersGivesTimeoutWithinTheCallTimeout) {
  FakeStore fake(io_);
  run([&]() -> awaitable<void> {
    auto c = co_await connect_fake(fake, timeouts(5s, 200ms));
    auto client = [&]() -> awaitable<void> {
      auto start = Clock::now();
      EXPECT_EQ(co_await kind_of(c->get("k")), Kind::kTimeout);
      EXPECT_GE(Clock::now() - start, 200ms);
      EXPECT_LT(Clock::now() - start, 3s);
      EXPECT_EQ(co_await kind_of(c->add("n", 1)), Kind::kClosed);  // closed after a timeout
    };
    co_await (client() && fake.read_until_closed());  // it ends when the client closes
  });
}

TEST_F(AsyncClientFaultTest, AStoreClosingMidReplyGivesClosed) {
  FakeStore fake(io_);
  run([&]() -> awaitable<void> {
    auto c = co_await connect_fake(fake, timeouts(5s));
    auto store = [&]() -> awaitable<void> {
      co_await fake.read(10);                               // GET k
      co_await fake.write(std::string("\x05\x00\x00", 3));  // part of a length
      fake.close();
    };
    EXPECT_EQ(co_await (kind_of(c->get("k")) && store()), Kind::kClosed);
  });
}

TEST_F(AsyncClientFaultTest, ServerClosingDuringAWaitGivesClosed) {
  run([&]() -> awaitable<void> {
    auto waiter = co_await connect();
    auto other = co_await connect();
    auto close_server = [&]() -> awaitable<void> {
      co_await other->check(keys("x"));  // a round trip: the wait is parked by now
      server_.close();
    };
    EXPECT_EQ(co_await (kind_of(waiter->wait(keys("never"), 10s)) && close_server()),
              Kind::kClosed);
  });
}

TEST_F(AsyncClientFaultTest, MalformedRepliesGiveProtocolAndClose) {
  FakeStore huge(io_), odd(io_);
  run([&]() -> awaitable<void> {
    auto c = co_await connect_fake(huge, timeouts(5s));
    auto claim_2gib = [&]() -> awaitable<void> {
      co_await huge.read(10);
      co_await huge.write(std::string("\x00\x00\x00\x80\x00\x00\x00\x00", 8));
    };
    StoreError e = co_await (error_of(c->get("k")) && claim_2gib());
    EXPECT_EQ(e.kind(), Kind::kProtocol);
    EXPECT_NE(std::string(e.what()).find("implausible"), std::string::npos) << e.what();
    EXPECT_EQ(co_await kind_of(c->add("n", 1)), Kind::kClosed);

    auto d = co_await connect_fake(odd, timeouts(5s));
    auto bad_check_reply = [&]() -> awaitable<void> {
      co_await odd.read(18);
      co_await odd.write("\x07");
    };
    EXPECT_EQ(co_await (kind_of(d->check(keys("k"))) && bad_check_reply()), Kind::kProtocol);
    EXPECT_EQ(co_await kind_of(d->check(keys("k"))), Kind::kClosed);
  });
}

}  // namespace
}  // namespace ddprun::store
