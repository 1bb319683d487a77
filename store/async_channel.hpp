// AsyncChannel: the connection behind an AsyncClient (async_client.hpp), and the helpers both
// halves use: async_channel.cpp (deadlines, the handshake, sending requests and reading replies)
// and async_client.cpp (AsyncClient: connecting with retries, one request per operation).
// Internal to store/ (not a public header).
#pragma once

#include <array>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_state.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "store/async_client.hpp"
#include "store/wire.hpp"

namespace ddprun::store::detail {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Kind = StoreError::Kind;
inline constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);

inline bool cancelled(const asio::cancellation_state& state) {
  return state.cancelled() != asio::cancellation_type::none;
}

inline Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return Clock::time_point::max();
  return Clock::now() + timeout;
}

// The connection behind an AsyncClient: the socket, the one deadline timer (when it fires it
// cancels the socket's pending operations) and a small read buffer. Only the executor's
// thread touches it, so the flags need no synchronisation.
class AsyncChannel : public std::enable_shared_from_this<AsyncChannel> {
 public:
  // Marks the channel busy with one operation and arms its deadline; undone when it ends.
  class Operation {
   public:
    Operation(AsyncChannel& channel, const char* name, Clock::time_point deadline);
    ~Operation() {
      channel_.busy_ = false;
      channel_.disarm();
    }
    Operation(const Operation&) = delete;  // (and not assignable: a reference member)

   private:
    AsyncChannel& channel_;
  };

  AsyncChannel(asio::any_io_executor executor, ClientOptions options, std::string peer)
      : socket_(executor), timer_(executor), options_(options), peer_(std::move(peer)) {}

  // One attempt: every address of host:port in turn, then the handshake, all by `deadline`.
  // False (and *error set) on failure.
  asio::awaitable<bool> open(std::string host, uint16_t port, Clock::time_point deadline,
                             std::string* error);
  void close();
  tcp::socket release_socket();  // see AsyncClient::release_socket
  Clock::time_point call_deadline() const { return deadline_after(options_.timeout); }
  const std::string& peer() const { return peer_; }

  asio::awaitable<void> write(std::string bytes);
  asio::awaitable<void> no_reply() { co_return; }  // these read the reply of each request
  template <typename T>
  asio::awaitable<T> read_le();  // u8 or i64
  asio::awaitable<std::string> read_bytes();
  asio::awaitable<std::vector<std::string>> read_values(size_t count);
  asio::awaitable<bool> read_check();
  // SET_WILL's or KEEP_ALIVE's acknowledgement; for KEEP_ALIVE (probes > 0) then the same
  // keep-alive on our end, best effort.
  asio::awaitable<void> read_ack(std::chrono::milliseconds interval, int probes);
  // The reply of a WAIT; once `timeout` passed, cancels the WAIT instead.
  asio::awaitable<bool> read_release(std::chrono::milliseconds timeout);

 private:
  void arm(Clock::time_point deadline);
  void disarm() {
    ++generation_;
    timer_.cancel();
  }
  void ready_for_io();
  void check(const boost::system::error_code& ec, const char* doing);
  [[noreturn]] void fail(Kind kind, const std::string& what);
  [[noreturn]] void fail_auth(AuthFailure failure);
  asio::awaitable<void> authenticate(uint32_t nonce);
  // The next reply byte of the AUTH exchange; a close instead is the store's answer: `failure`.
  asio::awaitable<uint8_t> read_auth_byte(AuthFailure failure);
  asio::awaitable<bool> fill(bool deadline_ok);
  asio::awaitable<void> read(char* out, size_t size);

  tcp::socket socket_;
  asio::steady_timer timer_;
  ClientOptions options_;
  std::string peer_;
  const char* op_name_ = "";       // of the operation in flight, for error messages
  std::array<char, 64 << 10> in_;  // received, not yet consumed: [in_begin_, in_end_)
  size_t in_begin_ = 0;
  size_t in_end_ = 0;
  uint64_t generation_ = 0;  // bumped by arm/disarm: a stale timer completion is ignored
  bool busy_ = false;
  bool closed_ = false;     // close() or a failure: every later operation throws kClosed
  bool timed_out_ = false;  // the armed deadline passed (the socket's operations cancelled)
};

// Here rather than in async_channel.cpp: AsyncClient::add (async_client.cpp) reads its reply
// with read_le<int64_t>.
template <typename T>
asio::awaitable<T> AsyncChannel::read_le() {
  char b[sizeof(T)];
  co_await read(b, sizeof b);
  co_return static_cast<T>(wire::load_le(b, sizeof b));
}

}  // namespace ddprun::store::detail
