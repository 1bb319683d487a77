// Our agents' store client: one TCP connection speaking the torch 2.x dialect (VALIDATE +
// PING handshake), so it works against our Server and against torch 2.x's own servers.
//
// Every blocking call has a deadline (ClientOptions::timeout unless given). Keys are sent as
// given: no "/" prefix is added (torch's TCPStore adds one; PrefixClient-style namespacing is
// done by wrapping). Errors throw StoreError; after kTimeout from wait()/get()/barrier() the
// connection stays usable (CANCEL_WAIT was sent), after any other error it is closed.
//
// Threads: not thread-safe; one thread calls at a time, except interrupt(), which any
// thread may call to make a blocked call throw kClosed.
//
// Refinements of the agreed contract: StoreError has a public constructor; a non-positive
// timeout means no deadline; compare_set() returns the server's reply (see StoreState).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "store/protocol.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::store {

// Why token authentication failed (StoreError::Kind::kAuth); see PROTOCOL.md, "AUTH".
enum class AuthFailure : uint8_t {
  kNone,
  kRefused,         // the store closed the connection at our proof: a different token
  kServerUnproven,  // the store's proof is wrong: it does not know our token
  kServerOpen,      // we have a token, the store has none
  kTokenRequired,   // the store has a token, we have none
  kUnsupported,     // the store closed the connection at AUTH (torch's, or an older ddprun)
};

class StoreError : public std::runtime_error {
 public:
  // kAuth: token authentication failed (auth_failure() says how); connect() does not retry it.
  enum class Kind { kConnect, kTimeout, kClosed, kProtocol, kAuth };
  StoreError(Kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  StoreError(AuthFailure failure, const std::string& what)
      : std::runtime_error(what), kind_(Kind::kAuth), auth_(failure) {}
  Kind kind() const { return kind_; }
  AuthFailure auth_failure() const { return auth_; }

 private:
  Kind kind_;
  AuthFailure auth_ = AuthFailure::kNone;
};

// A non-positive timeout means no deadline (like torch's kNoTimeout).
struct ClientOptions {
  // connect() retries with exponential back-off (10 ms doubling to 1 s, jittered) until then.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // default per-call deadline
  // The store's secret (ServerOptions::token). Set: connect() runs the AUTH exchange and
  // accepts only a store that proves it knows the secret too; empty: a store that asks for a
  // token is a kAuth error (kTokenRequired). Auth errors are final: connect() does not retry.
  std::string token;
};

class Client {
 public:
  static std::unique_ptr<Client> connect(const std::string& host, uint16_t port,
                                         const ClientOptions& options = {});
  ~Client();

  void set(std::string_view key, std::string_view value);
  std::string get(std::string_view key);  // WAIT then GET, default deadline
  std::string get(std::string_view key, std::chrono::milliseconds timeout);
  int64_t add(std::string_view key, int64_t delta);
  // COMPARE_SET; returns the value now stored (or `expected` if the key was absent).
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired);
  bool check(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys);  // default deadline
  // kTimeout: sends CANCEL_WAIT, connection stays usable.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  int64_t num_keys();
  bool delete_key(std::string_view key);
  void append(std::string_view key, std::string_view value);
  // WAIT on all keys (default deadline), then MULTI_GET.
  std::vector<std::string> multi_get(const std::vector<std::string>& keys);
  void multi_set(const std::vector<std::pair<std::string, std::string>>& kvs);
  void queue_push(std::string_view key, std::string_view value);
  std::optional<std::string> queue_pop(std::string_view key);  // non-blocking
  int64_t queue_len(std::string_view key);
  std::vector<std::string> list_keys();
  // Counter at key +1; returns once it reaches world_size (kTimeout as for wait()).
  void barrier(std::string_view key, int64_t world_size, std::chrono::milliseconds timeout);
  void ping();
  void interrupt();  // thread-safe

  // ddprun-only (our Server; torch's servers close the connection, which throws kClosed):
  // when this connection ends, for any reason (closed, the process killed, the host gone),
  // the server applies COMPARE_SET(key, expected, desired). An empty key clears the will; a
  // new will replaces the previous one.
  void set_will(std::string_view key, std::string_view expected, std::string_view desired);
  // ddprun-only: TCP keep-alive on both ends of this connection: a peer that stops answering
  // is dropped after about interval x probes (the server then applies the will; a blocked
  // call here throws kClosed).
  void keep_alive(std::chrono::milliseconds interval, int probes);

 private:
  using Clock = std::chrono::steady_clock;
  Client(sys::UniqueFd fd, ClientOptions options, std::string peer);

  static Clock::time_point deadline_after(std::chrono::milliseconds timeout);
  Clock::time_point deadline() const { return deadline_after(options_.timeout); }
  void send(const std::string& frame, Clock::time_point deadline);
  void recv(char* data, size_t size, Clock::time_point deadline);
  uint8_t recv_u8(Clock::time_point deadline);
  int64_t recv_i64(Clock::time_point deadline);
  std::string recv_bytes(Clock::time_point deadline);
  // Waits for the reply byte of a WAIT/BARRIER; on timeout cancels it and throws kTimeout.
  void await_release(std::chrono::milliseconds timeout, const std::string& what);
  void handshake(Clock::time_point deadline);
  void authenticate(uint32_t nonce, Clock::time_point deadline);
  // recv(), except that a closed connection returns false (the store's answer during AUTH).
  bool recv_unless_closed(char* data, size_t size, Clock::time_point deadline);
  [[noreturn]] void fail(StoreError::Kind kind, const std::string& what);
  [[noreturn]] void fail_auth(AuthFailure failure);

  sys::UniqueFd fd_;
  ClientOptions options_;
  std::string peer_;
  std::atomic<bool> interrupted_{false};
  bool broken_ = false;  // after an error mid-exchange: every later call throws kClosed
};

}  // namespace ddprun::store
