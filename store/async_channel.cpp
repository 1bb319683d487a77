// AsyncChannel (async_channel.hpp): one operation at a time under its deadline timer, opening
// the connection (each address in turn, then the PING or AUTH handshake), sending requests and
// reading replies (values, acknowledgements, a WAIT's release or its cancellation).
#include "store/async_channel.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/write.hpp>
#include <cstring>

#include "store/auth.hpp"
#include "store/client_frames.hpp"
#include "store/socket_io.hpp"
#include "store/sys/async_resolve.hpp"
#include "store/wire.hpp"

namespace ddprun::store {
namespace {

using namespace client_frames;  // NOLINT: the frame builders

}  // namespace

namespace detail {

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

tcp::socket AsyncChannel::release_socket() {
  if (busy_ || closed_ || in_begin_ != in_end_) {
    throw StoreError(Kind::kProtocol, "store " + peer_ + ": connection not idle at hand-over");
  }
  disarm();
  closed_ = true;
  return std::move(socket_);
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

}  // namespace ddprun::store
