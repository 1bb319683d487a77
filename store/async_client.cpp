#include "store/async_client.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <type_traits>

#include "store/auth.hpp"
#include "store/client_frames.hpp"
#include "store/socket_io.hpp"
#include "store/sys/async_resolve.hpp"
#include "store/sys/net.hpp"
#include "store/wire.hpp"

namespace ddprun::store {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Kind = StoreError::Kind;
using namespace client_frames;  // NOLINT: the frame builders
constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);

bool cancelled(const asio::cancellation_state& state) {
  return state.cancelled() != asio::cancellation_type::none;
}

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return Clock::time_point::max();
  return Clock::now() + timeout;
}

}  // namespace

namespace detail {

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

AsyncChannel::Operation::Operation(AsyncChannel& channel, const char* name,
                                   Clock::time_point deadline)
    : channel_(channel) {
  const std::string at = "store " + channel_.peer_ + ": ";
  if (channel_.closed_) throw StoreError(Kind::kClosed, at + "connection closed");
  if (channel_.busy_) {
    throw StoreError(Kind::kProtocol, at + name + " while " + channel_.op_name_ +
                                          " is in flight (one operation at a time)");
  }
  channel_.busy_ = true;
  channel_.op_name_ = name;
  channel_.arm(deadline);
}

void AsyncChannel::arm(Clock::time_point deadline) {
  disarm();
  timed_out_ = false;
  if (deadline == Clock::time_point::max()) return;
  timer_.expires_at(deadline);
  timer_.async_wait(
      [weak = weak_from_this(), generation = generation_](const boost::system::error_code& ec) {
        auto self = weak.lock();
        if (ec || !self || self->generation_ != generation) return;
        self->timed_out_ = true;
        boost::system::error_code ignored;
        self->socket_.cancel(ignored);  // the pending read/write ends with operation_aborted
      });
}

void AsyncChannel::close() {
  closed_ = true;
  disarm();
  boost::system::error_code ignored;
  socket_.close(ignored);  // pending operations end with operation_aborted
}

void AsyncChannel::fail(Kind kind, const std::string& what) {
  close();
  throw StoreError(kind, "store " + peer_ + ": " + what);
}

void AsyncChannel::fail_auth(AuthFailure failure) {
  close();
  throw auth_error(failure, peer_);
}

void AsyncChannel::ready_for_io() {  // the deadline may have passed while nothing was pending
  if (closed_) throw StoreError(Kind::kClosed, "store " + peer_ + ": connection closed");
  if (timed_out_) fail(Kind::kTimeout, std::string(op_name_) + " timed out");
}

void AsyncChannel::check(const boost::system::error_code& ec, const char* doing) {
  if (!ec) return;
  ready_for_io();  // closed, or the deadline passed
  const std::string op = op_name_;
  if (ec == asio::error::eof) fail(Kind::kClosed, "connection closed by the store during " + op);
  if (ec == asio::error::operation_aborted) fail(Kind::kClosed, op + " cancelled " + doing);
  fail(Kind::kClosed, "connection lost during " + op + ": " + ec.message());
}

asio::awaitable<bool> AsyncChannel::open(std::string host, uint16_t port,
                                         Clock::time_point deadline, std::string* error) {
  // Off this thread: a name server that does not answer must not stop the caller's loop.
  std::vector<sys::ResolvedAddress> addresses = co_await sys::async_resolve(host, port, error);
  if (cancelled(co_await asio::this_coro::cancellation_state)) co_return false;
  Operation op(*this, "handshake", deadline);
  boost::system::error_code ec = asio::error::host_not_found;
  for (size_t i = 0; ec && !timed_out_ && i < addresses.size(); ++i) {
    tcp::endpoint endpoint;
    endpoint.resize(addresses[i].len);
    std::memcpy(endpoint.data(), &addresses[i].addr, addresses[i].len);
    socket_.close(ec);  // the previous address's socket
    socket_.open(endpoint.protocol(), ec);
    if (!ec) socket_.set_option(tcp::no_delay(true), ec);
    if (!ec) std::tie(ec) = co_await socket_.async_connect(endpoint, kUseTuple);
    if (ec) *error = timed_out_ ? "connect timed out" : ec.message();
  }
  if (ec) co_return false;
  try {
    const auto nonce = static_cast<uint32_t>(::getpid());
    if (!options_.token.empty()) {
      co_await authenticate(nonce);
      co_return true;
    }
    co_await write(hello_frame(nonce));
    char echo[4];
    co_await read(echo, sizeof echo);
    const uint64_t echoed = wire::load_le(echo, 4);
    if (echoed == nonce) co_return true;
    if (echoed == kAuthRequiredWord) fail_auth(AuthFailure::kTokenRequired);
    *error = "PING echoed a wrong nonce";
  } catch (const StoreError& e) {
    if (e.kind() == Kind::kAuth) throw;  // a different token: retrying cannot help
    *error = e.what();
  }
  co_return false;
}

// PROTOCOL.md, "AUTH": hello + AUTH(client nonce); check the store's proof; AUTH_PROOF + PING.
asio::awaitable<void> AsyncChannel::authenticate(uint32_t nonce) {
  const std::string client_nonce = auth::nonce();
  co_await write(auth_hello_frame(client_nonce));
  const uint8_t mode = co_await read_auth_byte(AuthFailure::kUnsupported);
  if (mode == kAuthOpen) fail_auth(AuthFailure::kServerOpen);
  if (mode != kAuthChallenge) fail(Kind::kProtocol, "bad reply to AUTH");
  std::string blobs[2];  // the store's nonce and proof
  for (std::string& blob : blobs) {
    if (static_cast<uint64_t>(co_await read_le<int64_t>()) != kAuthBytes) {
      fail(Kind::kProtocol, "bad reply to AUTH");
    }
    blob.resize(kAuthBytes);
    co_await read(blob.data(), blob.size());
  }
  const std::string& token = options_.token;
  if (!auth::same(blobs[1], auth::server_proof(token, client_nonce, blobs[0]))) {
    fail_auth(AuthFailure::kServerUnproven);
  }
  co_await write(auth_proof_frame(auth::client_proof(token, blobs[0], client_nonce), nonce));
  if (co_await read_auth_byte(AuthFailure::kRefused) != kExtensionAck) {
    fail(Kind::kProtocol, "bad reply to AUTH_PROOF");
  }
  char echo[4];
  co_await read(echo, sizeof echo);
  if (wire::load_le(echo, 4) != nonce) fail(Kind::kProtocol, "PING echoed a wrong nonce");
}

asio::awaitable<uint8_t> AsyncChannel::read_auth_byte(AuthFailure failure) {
  try {
    co_return co_await read_le<uint8_t>();
  } catch (const StoreError& e) {
    if (e.kind() != Kind::kClosed) throw;
    fail_auth(failure);
  }
}

asio::awaitable<void> AsyncChannel::write(std::string bytes) {
  ready_for_io();
  auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(bytes), kUseTuple);
  check(ec, "sending the request");
}

// Refills the (empty) read buffer. Returns false only if `deadline_ok` and the deadline
// passed first: for a WAIT's reply, where that is an answer rather than an error.
asio::awaitable<bool> AsyncChannel::fill(bool deadline_ok) {
  ready_for_io();
  auto [ec, n] = co_await socket_.async_read_some(asio::buffer(in_), kUseTuple);
  if (ec && deadline_ok && timed_out_ && !closed_) co_return false;
  check(ec, "waiting for the reply");
  in_begin_ = 0;
  in_end_ = n;
  co_return true;
}

asio::awaitable<void> AsyncChannel::read(char* out, size_t size) {
  while (size > 0) {
    if (in_begin_ == in_end_) co_await fill(false);
    size_t take = std::min(size, in_end_ - in_begin_);
    std::memcpy(out, in_.data() + in_begin_, take);
    in_begin_ += take;
    out += take;
    size -= take;
  }
}

template <typename T>
asio::awaitable<T> AsyncChannel::read_le() {
  char b[sizeof(T)];
  co_await read(b, sizeof b);
  co_return static_cast<T>(wire::load_le(b, sizeof b));
}

asio::awaitable<std::string> AsyncChannel::read_bytes() {
  auto length = static_cast<uint64_t>(co_await read_le<int64_t>());
  if (length > kMaxReplyBytes) {
    fail(Kind::kProtocol, "reply of " + std::to_string(length) + " bytes is implausible");
  }
  std::string out;
  constexpr size_t kChunk = 1 << 20;  // grow with the bytes that actually arrive
  while (out.size() < length) {
    size_t n = std::min<uint64_t>(kChunk, length - out.size());
    size_t at = out.size();
    out.resize(at + n);
    co_await read(out.data() + at, n);
  }
  co_return out;
}

asio::awaitable<std::vector<std::string>> AsyncChannel::read_values(size_t count) {
  std::vector<std::string> values;
  values.reserve(count);  // our own key count, not one off the wire
  for (size_t i = 0; i < count; ++i) values.push_back(co_await read_bytes());
  co_return values;
}

asio::awaitable<bool> AsyncChannel::read_check() {
  uint8_t reply = co_await read_le<uint8_t>();
  if (reply > kCheckNotReady) fail(Kind::kProtocol, std::string("bad reply to ") + op_name_);
  co_return reply == kCheckReady;
}

asio::awaitable<void> AsyncChannel::read_ack(std::chrono::milliseconds interval, int probes) {
  uint8_t reply = co_await read_le<uint8_t>();
  if (reply != kExtensionAck) fail(Kind::kProtocol, std::string("bad reply to ") + op_name_);
  if (probes > 0) socket_io::set_keep_alive(socket_.native_handle(), interval, probes);
}

asio::awaitable<bool> AsyncChannel::read_release(std::chrono::milliseconds timeout) {
  arm(deadline_after(timeout));  // the request is out: now the caller's deadline applies
  bool replied = in_begin_ != in_end_;
  if (!replied) replied = co_await fill(true);
  if (replied) {
    if (static_cast<uint8_t>(in_[in_begin_++]) != kStopWaiting) {
      fail(Kind::kProtocol, "bad reply to WAIT");
    }
    co_return true;
  }
  // Cancel. If the release crossed our CANCEL_WAIT, its 0x00 comes before the 0x01: the keys
  // all exist then, so the answer is true.
  arm(call_deadline());
  co_await write(frame(Op::kCancelWait));
  uint8_t reply = co_await read_le<uint8_t>();
  const bool released = reply == kStopWaiting;
  if (released) reply = co_await read_le<uint8_t>();
  if (reply != kWaitCanceled) fail(Kind::kProtocol, "bad reply to CANCEL_WAIT");
  co_return released;
}

}  // namespace detail

namespace {

using detail::AsyncChannel;

// One request and its reply as one operation. The coroutine frame holds the channel, so it
// outlives a client destroyed meanwhile; `reply` reads the reply (a member or a callable).
template <typename Reply>
std::invoke_result_t<Reply, AsyncChannel&> request(std::shared_ptr<AsyncChannel> channel,
                                                   std::string frame, Reply reply) {
  const char* name = decode_opcode(Dialect::kTorch2, static_cast<uint8_t>(frame[0]))->name;
  AsyncChannel::Operation guard(*channel, name, channel->call_deadline());
  co_await channel->write(std::move(frame));
  co_return co_await std::invoke(reply, *channel);
}

}  // namespace

AsyncClient::~AsyncClient() {
  channel_->close();
}

asio::awaitable<std::unique_ptr<AsyncClient>> AsyncClient::connect(asio::any_io_executor executor,
                                                                   std::string host, uint16_t port,
                                                                   ClientOptions options) {
  std::string peer = sys::endpoint_text(host, port);
  const auto deadline = deadline_after(options.connect_timeout);
  std::minstd_rand jitter(std::random_device{}());
  auto backoff = std::chrono::milliseconds(10);
  asio::steady_timer pause(executor);
  std::string error;
  for (;;) {
    // One attempt gets at most the default call timeout (a server that accepts but never
    // answers the PING must not eat the whole connect budget).
    auto attempt_deadline = std::min(deadline, deadline_after(options.timeout));
    auto channel = std::make_shared<AsyncChannel>(executor, options, peer);
    const bool opened = co_await channel->open(host, port, attempt_deadline, &error);
    if (cancelled(co_await asio::this_coro::cancellation_state)) break;
    if (opened) co_return std::unique_ptr<AsyncClient>(new AsyncClient(std::move(channel)));
    const auto now = Clock::now();
    if (now >= deadline) break;
    const auto sleep = backoff * (75 + static_cast<int>(jitter() % 50)) / 100;  // +-25 %
    pause.expires_after(std::min<Clock::duration>(sleep, deadline - now));
    co_await pause.async_wait(kUseTuple);
    if (cancelled(co_await asio::this_coro::cancellation_state)) break;
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  if (cancelled(co_await asio::this_coro::cancellation_state)) {
    throw StoreError(Kind::kClosed, "connecting to the store at " + peer + " was cancelled");
  }
  throw StoreError(Kind::kConnect, "cannot connect to the store at " + peer + " within " +
                                       std::to_string(options.connect_timeout.count()) +
                                       " ms: " + error);
}

asio::awaitable<void> AsyncClient::set(std::string key, std::string value) {
  return request(channel_, key_value_frame(Op::kSet, key, value), &AsyncChannel::no_reply);
}

asio::awaitable<std::string> AsyncClient::get(std::string key) {
  return request(channel_, frame(Op::kGet, key), &AsyncChannel::read_bytes);
}

asio::awaitable<int64_t> AsyncClient::add(std::string key, int64_t delta) {
  return request(channel_, key_i64_frame(Op::kAdd, key, delta), &AsyncChannel::read_le<int64_t>);
}

asio::awaitable<std::string> AsyncClient::compare_set(std::string key, std::string expected,
                                                      std::string desired) {
  return request(channel_, compare_set_frame(Op::kCompareSet, key, expected, desired),
                 &AsyncChannel::read_bytes);
}

asio::awaitable<bool> AsyncClient::check(std::vector<std::string> keys) {
  return request(channel_, frame_keys(Op::kCheck, keys), &AsyncChannel::read_check);
}

asio::awaitable<bool> AsyncClient::wait(std::vector<std::string> keys,
                                        std::chrono::milliseconds timeout) {
  return request(channel_, frame_keys(Op::kWait, keys),
                 [timeout](AsyncChannel& c) { return c.read_release(timeout); });
}

asio::awaitable<std::vector<std::string>> AsyncClient::multi_get(std::vector<std::string> keys) {
  return request(channel_, frame_keys(Op::kMultiGet, keys),
                 [count = keys.size()](AsyncChannel& c) { return c.read_values(count); });
}

asio::awaitable<void> AsyncClient::multi_set(std::vector<std::pair<std::string, std::string>> kvs) {
  return request(channel_, multi_set_frame(kvs), &AsyncChannel::no_reply);
}

asio::awaitable<void> AsyncClient::set_will(std::string key, std::string expected,
                                            std::string desired) {
  return request(channel_, compare_set_frame(Op::kSetWill, key, expected, desired),
                 [](AsyncChannel& c) { return c.read_ack({}, 0); });
}

asio::awaitable<void> AsyncClient::keep_alive(std::chrono::milliseconds interval, int probes) {
  if (interval.count() <= 0 || probes < 1) {
    throw std::invalid_argument("keep_alive: interval and probes must be positive");
  }
  return request(channel_, keep_alive_frame(interval, probes),
                 [interval, probes](AsyncChannel& c) { return c.read_ack(interval, probes); });
}

void AsyncClient::close() {
  channel_->close();
}

const std::string& AsyncClient::peer() const {
  return channel_->peer();
}

}  // namespace ddprun::store
