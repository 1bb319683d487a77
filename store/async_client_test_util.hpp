// Shared by the AsyncClient tests: a real Server on loopback, a scripted fake store, and
// bounded coroutine runners (a bug fails a test instead of hanging it).
#pragma once

#include <gtest/gtest.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <stdexcept>

#include "store/async_client.hpp"
#include "store/client_frames.hpp"
#include "store/server.hpp"

namespace ddprun::store {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace std::chrono_literals;
using namespace std::string_literals;
using namespace asio::experimental::awaitable_operators;
using Clock = std::chrono::steady_clock;
using Kind = StoreError::Kind;
template <typename T>
using awaitable = asio::awaitable<T>;
constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);

inline ServerOptions listen_on(std::string host, uint16_t port = 0) {
  ServerOptions options;
  options.host = std::move(host);
  options.port = port;
  return options;
}

inline ClientOptions timeouts(std::chrono::milliseconds connect,
                              std::chrono::milliseconds call = 20s) {
  ClientOptions options;
  options.connect_timeout = connect;
  options.timeout = call;
  return options;
}

// A free port: a server is bound to it for a moment (closing it frees the port at once).
inline uint16_t reserve_port(asio::io_context& io) {
  Server probe(io, listen_on("127.0.0.1"));
  return probe.port();
}

// Runs `body` on `io` until it ends; fails (rather than hangs) after `limit`.
inline void run_on(asio::io_context& io, awaitable<void> body,
                   std::chrono::milliseconds limit = 20s) {
  struct Outcome {
    bool done = false;
    std::exception_ptr error;
  };
  auto outcome = std::make_shared<Outcome>();
  io.restart();
  asio::co_spawn(io, std::move(body), [outcome](std::exception_ptr e) {
    outcome->done = true;
    outcome->error = e;
  });
  const auto deadline = Clock::now() + limit;
  while (!outcome->done && !io.stopped() && Clock::now() < deadline) io.run_one_until(deadline);
  ASSERT_TRUE(outcome->done) << "the test's coroutine did not end within " << limit.count()
                             << " ms";
  try {
    if (outcome->error) std::rethrow_exception(outcome->error);
  } catch (const std::exception& e) {
    FAIL() << "uncaught exception: " << e.what();
  }
}

// A key list. GCC 12 cannot compile a braced list of strings (an initializer_list's array)
// inside a co_await expression, so tests build key lists with this instead of {"a", "b"}.
template <typename... Keys>
inline std::vector<std::string> keys(Keys... k) {
  std::vector<std::string> out;
  (out.emplace_back(k), ...);
  return out;
}

// The StoreError `op` ends with; the test fails if it ends without one.
template <typename T>
inline awaitable<StoreError> error_of(awaitable<T> op) {
  try {
    co_await std::move(op);
  } catch (const StoreError& e) {
    co_return e;
  }
  ADD_FAILURE() << "expected a StoreError";
  co_return StoreError(Kind::kProtocol, "none thrown");
}

template <typename T>
inline awaitable<Kind> kind_of(awaitable<T> op) {
  StoreError e = co_await error_of(std::move(op));
  co_return e.kind();
}

inline awaitable<void> pause(std::chrono::milliseconds duration) {
  asio::steady_timer timer(co_await asio::this_coro::executor, duration);
  co_await timer.async_wait(asio::use_awaitable);
}

// wait() that records when it returned.
inline awaitable<bool> wait_flagged(AsyncClient& client, std::vector<std::string> keys,
                                    std::chrono::milliseconds timeout, bool& returned) {
  bool result = co_await client.wait(std::move(keys), timeout);
  returned = true;
  co_return result;
}

// A hand-driven store on loopback: the test reads its client's requests and scripts (or
// withholds) the replies.
class FakeStore {
 public:
  explicit FakeStore(asio::io_context& io)
      : acceptor_(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0)), socket_(io) {}
  uint16_t port() const { return acceptor_.local_endpoint().port(); }
  size_t held() const { return held_.size(); }

  // Accepts one client and answers its VALIDATE + PING hello by echoing the nonce.
  awaitable<void> accept() {
    co_await acceptor_.async_accept(socket_, asio::use_awaitable);
    std::string hello = co_await read(10);
    EXPECT_EQ(hello.substr(0, 6), client_frames::hello_frame(0).substr(0, 6));
    co_await write(hello.substr(6));
  }
  awaitable<std::string> read(size_t size) {
    std::string out(size, '\0');
    co_await asio::async_read(socket_, asio::buffer(out), asio::use_awaitable);
    co_return out;
  }
  awaitable<void> write(std::string bytes) {
    co_await asio::async_write(socket_, asio::buffer(bytes), asio::use_awaitable);
  }
  // Reads and drops everything until the client closes: a store that never answers.
  awaitable<void> read_until_closed() {
    char buf[256];
    for (;;) {
      auto [ec, n] = co_await socket_.async_read_some(asio::buffer(buf), kUseTuple);
      if (ec) co_return;
    }
  }
  // Accepts every client and holds it open without a byte of reply.
  awaitable<void> accept_silently() {
    for (;;) held_.push_back(co_await acceptor_.async_accept(asio::use_awaitable));
  }
  void close() { socket_.close(); }

 private:
  tcp::acceptor acceptor_;
  tcp::socket socket_;
  std::vector<tcp::socket> held_;
};

class AsyncClientTest : public ::testing::Test {
 protected:
  asio::io_context io_;
  Server server_{io_, listen_on("127.0.0.1")};

  // No default argument: GCC 12 destroys a defaulted ClientOptions (it holds a string, the
  // token) twice when the call sits in a co_await expression.
  awaitable<std::unique_ptr<AsyncClient>> connect() { return connect(ClientOptions{}); }
  awaitable<std::unique_ptr<AsyncClient>> connect(ClientOptions options) {
    return AsyncClient::connect(io_.get_executor(), "127.0.0.1", server_.port(), options);
  }
  awaitable<std::unique_ptr<AsyncClient>> connect_fake(FakeStore& fake, ClientOptions options) {
    return AsyncClient::connect(io_.get_executor(), "127.0.0.1", fake.port(), options) &&
           fake.accept();
  }
  template <typename F>
  void run(F&& body) {
    run_on(io_, body());
  }
};

}  // namespace
}  // namespace ddprun::store
