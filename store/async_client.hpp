// AsyncClient: our store client as C++20 coroutines on a Boost.Asio executor, so the agent
// talks to the store from its own io_context without helper threads. Same wire bytes as the
// blocking Client (torch 2.x dialect, VALIDATE + PING handshake, the ddprun-only SET_WILL and
// KEEP_ALIVE), same StoreError kinds and ClientOptions.
//
// Deadlines: every operation is bounded by ClientOptions::timeout (non-positive: none), except
// wait(), whose reply is bounded by its own `timeout`. A deadline passing in any operation but
// wait() throws kTimeout and closes the connection (it may be mid-frame); wait() returns false
// instead and the connection stays usable (CANCEL_WAIT was sent). kClosed: the store closed or
// reset the connection, or close() was called. kProtocol: a malformed reply (the connection is
// closed), or a second operation started while one is in flight (the connection is left alone).
// Cancelling an operation through Asio (a cancellation slot, awaitable_operators' ||) closes
// the connection, which may be mid-frame: that operation throws kClosed.
//
// Threads and ownership: the caller owns the client (unique_ptr). Call everything from the
// executor's thread (one thread, or a strand), one operation at a time per client; several
// clients may have operations in flight at once. close() may be called while an operation is
// suspended: the operation then throws kClosed. Destroying the client closes the connection
// (so the server applies the will) and is safe at any time: each operation's coroutine frame
// shares the connection's state from the call on, and one still pending then throws kClosed.
//
// GCC 12 cannot compile a braced list of strings inside a co_await expression
// (`co_await c.wait({"a"}, t)`: "array used as initializer"): build the vector first.
//
// Host names are resolved with sys::async_resolve (on a thread of its own, so DNS never blocks
// the executor); address literals are never looked up.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "store/client.hpp"

namespace ddprun::store {

namespace detail {
class AsyncChannel;
}

class AsyncClient {
 public:
  template <typename T>
  using awaitable = boost::asio::awaitable<T>;

  // Connects (retrying with jittered exponential back-off, 10 ms doubling to 1 s, until
  // options.connect_timeout; each attempt bounded by options.timeout), handshakes, and returns
  // a client bound to `executor`. Throws StoreError(kConnect) naming host:port. Cancelling it
  // (a cancellation slot on the awaiting coroutine) ends it at once, name lookup included,
  // with StoreError(kClosed, "... was cancelled").
  // `options` has no default: GCC 12 destroys a defaulted ClientOptions argument (a class
  // with a string) twice when the call sits in a co_await expression; pass a named one.
  static awaitable<std::unique_ptr<AsyncClient>> connect(boost::asio::any_io_executor executor,
                                                         std::string host, uint16_t port,
                                                         ClientOptions options);
  ~AsyncClient();  // closes the connection
  AsyncClient(const AsyncClient&) = delete;
  AsyncClient& operator=(const AsyncClient&) = delete;

  awaitable<void> set(std::string key, std::string value);
  awaitable<std::string> get(std::string key);  // GET only, no waiting: a missing key reads ""
  awaitable<int64_t> add(std::string key, int64_t delta);
  // COMPARE_SET; returns the value now stored (or `expected` if the key was absent).
  awaitable<std::string> compare_set(std::string key, std::string expected, std::string desired);
  awaitable<bool> check(std::vector<std::string> keys);
  // True once every key exists; false when `timeout` passed first (a non-positive timeout: no
  // deadline). If the keys appeared just as the deadline passed (the store's release crossed
  // our CANCEL_WAIT), every key exists and the answer is true.
  awaitable<bool> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout);
  // MULTI_GET, no waiting: a missing key reads "".
  awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys);
  awaitable<void> multi_set(std::vector<std::pair<std::string, std::string>> kvs);
  // ddprun-only, see Client::set_will: when this connection ends for any reason the server
  // applies COMPARE_SET(key, expected, desired). An empty key clears the will.
  awaitable<void> set_will(std::string key, std::string expected, std::string desired);
  // ddprun-only, see Client::keep_alive: TCP keep-alive on both ends of the connection.
  // The call itself throws std::invalid_argument unless interval and probes are positive.
  awaitable<void> keep_alive(std::chrono::milliseconds interval, int probes);

  // Closes the connection; an operation in progress ends with kClosed, later ones throw it.
  void close();
  // Hands over the connected (and authenticated) socket, no operation in flight: for a caller
  // that speaks its own framing on it (the store proxy's multiplexed connection, proxy.hpp). The
  // client is closed afterwards.
  boost::asio::ip::tcp::socket release_socket();
  const std::string& peer() const;  // "host:port" ("[::1]:29400" for IPv6 literals)

 private:
  explicit AsyncClient(std::shared_ptr<detail::AsyncChannel> channel)
      : channel_(std::move(channel)) {}

  // Shared with each operation's coroutine frame (see the header comment).
  std::shared_ptr<detail::AsyncChannel> channel_;
};

}  // namespace ddprun::store
