#include "store/client.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <stdexcept>
#include <thread>

#include "store/auth.hpp"
#include "store/client_frames.hpp"
#include "store/socket_io.hpp"
#include "store/sys/fd.hpp"
#include "store/wire.hpp"

namespace ddprun::store {
namespace {

using Kind = StoreError::Kind;
using socket_io::Status;

using client_frames::frame;
using client_frames::frame_keys;
using client_frames::kMaxReplyBytes;

}  // namespace

Client::Client(sys::UniqueFd fd, ClientOptions options, std::string peer)
    : fd_(std::move(fd)), options_(options), peer_(std::move(peer)) {}

Client::~Client() = default;

Client::Clock::time_point Client::deadline_after(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return Clock::time_point::max();
  return Clock::now() + timeout;
}

std::unique_ptr<Client> Client::connect(const std::string& host, uint16_t port,
                                        const ClientOptions& options) {
  std::string peer = host + ":" + std::to_string(port);
  auto deadline = deadline_after(options.connect_timeout);
  std::minstd_rand jitter(static_cast<unsigned>(::getpid()) ^
                          static_cast<unsigned>(Clock::now().time_since_epoch().count()));
  auto backoff = std::chrono::milliseconds(10);
  std::string error;
  for (;;) {
    // One attempt gets at most the default call timeout (a server that accepts but never
    // answers the PING must not eat the whole connect budget).
    auto attempt_deadline = std::min(deadline, deadline_after(options.timeout));
    sys::UniqueFd fd = socket_io::connect_tcp(host, port, attempt_deadline, &error);
    if (fd) {
      std::unique_ptr<Client> client(new Client(std::move(fd), options, peer));
      try {
        client->handshake(attempt_deadline);
        return client;
      } catch (const StoreError& e) {
        if (e.kind() == Kind::kAuth) throw;  // a different token: retrying cannot help
        error = e.what();
      }
    }
    auto now = Clock::now();
    if (now >= deadline) break;
    std::chrono::milliseconds sleep = backoff * (75 + static_cast<int>(jitter() % 50)) / 100;
    if (deadline != Clock::time_point::max()) {
      sleep =
          std::min(sleep, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
    }
    std::this_thread::sleep_for(sleep);  // back-off between attempts: a real timeout
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  throw StoreError(Kind::kConnect, "cannot connect to the store at " + peer + " within " +
                                       std::to_string(options.connect_timeout.count()) +
                                       " ms: " + error);
}

void Client::handshake(Clock::time_point deadline) {
  uint32_t nonce = static_cast<uint32_t>(::getpid());
  if (!options_.token.empty()) return authenticate(nonce, deadline);
  send(client_frames::hello_frame(nonce), deadline);
  char echo[4];
  recv(echo, sizeof echo, deadline);
  const uint64_t echoed = wire::load_le(echo, 4);
  if (echoed == kAuthRequiredWord) fail_auth(AuthFailure::kTokenRequired);
  if (echoed != nonce) fail(Kind::kProtocol, "PING echoed a wrong nonce");
}

// PROTOCOL.md, "AUTH": hello + AUTH(client nonce); check the store's proof; AUTH_PROOF + PING.
// A close where a reply was due is the store's answer (see AuthFailure).
void Client::authenticate(uint32_t nonce, Clock::time_point deadline) {
  const std::string client_nonce = auth::nonce();
  send(client_frames::auth_hello_frame(client_nonce), deadline);
  char mode = 0;
  if (!recv_unless_closed(&mode, 1, deadline)) fail_auth(AuthFailure::kUnsupported);
  if (static_cast<uint8_t>(mode) == kAuthOpen) fail_auth(AuthFailure::kServerOpen);
  if (static_cast<uint8_t>(mode) != kAuthChallenge) fail(Kind::kProtocol, "bad reply to AUTH");
  std::string blobs[2];  // the store's nonce and proof
  for (std::string& blob : blobs) {
    char length[8];
    recv(length, sizeof length, deadline);
    if (wire::load_le(length, 8) != kAuthBytes) fail(Kind::kProtocol, "bad reply to AUTH");
    blob.resize(kAuthBytes);
    recv(blob.data(), blob.size(), deadline);
  }
  const std::string& token = options_.token;
  if (!auth::same(blobs[1], auth::server_proof(token, client_nonce, blobs[0]))) {
    fail_auth(AuthFailure::kServerUnproven);
  }
  send(client_frames::auth_proof_frame(auth::client_proof(token, blobs[0], client_nonce), nonce),
       deadline);
  char ack = 0;
  if (!recv_unless_closed(&ack, 1, deadline)) fail_auth(AuthFailure::kRefused);
  if (static_cast<uint8_t>(ack) != kExtensionAck) fail(Kind::kProtocol, "bad reply to AUTH_PROOF");
  char echo[4];
  recv(echo, sizeof echo, deadline);
  if (wire::load_le(echo, 4) != nonce) fail(Kind::kProtocol, "PING echoed a wrong nonce");
}

bool Client::recv_unless_closed(char* data, size_t size, Clock::time_point deadline) {
  Status s = socket_io::recv_exact(fd_.get(), data, size, deadline);
  if (interrupted_) fail(Kind::kClosed, "interrupted");
  if (s == Status::kTimeout) fail(Kind::kTimeout, "timed out waiting for a reply");
  return s == Status::kOk;
}

void Client::fail_auth(AuthFailure failure) {
  broken_ = true;
  throw client_frames::auth_error(failure, peer_);
}

void Client::fail(Kind kind, const std::string& what) {
  broken_ = true;
  throw StoreError(kind, "store " + peer_ + ": " + what);
}

void Client::send(const std::string& bytes, Clock::time_point deadline) {
  if (broken_) throw StoreError(Kind::kClosed, "store " + peer_ + ": connection closed");
  Status s = socket_io::send_all(fd_.get(), bytes.data(), bytes.size(), deadline);
  if (interrupted_) fail(Kind::kClosed, "interrupted");
  if (s == Status::kTimeout) fail(Kind::kTimeout, "timed out sending a request");
  if (s != Status::kOk) fail(Kind::kClosed, "connection lost while sending");
}

void Client::recv(char* data, size_t size, Clock::time_point deadline) {
  if (broken_) throw StoreError(Kind::kClosed, "store " + peer_ + ": connection closed");
  Status s = socket_io::recv_exact(fd_.get(), data, size, deadline);
  if (interrupted_) fail(Kind::kClosed, "interrupted");
  if (s == Status::kTimeout) fail(Kind::kTimeout, "timed out waiting for a reply");
  if (s != Status::kOk) fail(Kind::kClosed, "connection closed by the store");
}

uint8_t Client::recv_u8(Clock::time_point deadline) {
  char b;
  recv(&b, 1, deadline);
  return static_cast<uint8_t>(b);
}

int64_t Client::recv_i64(Clock::time_point deadline) {
  char b[8];
  recv(b, 8, deadline);
  return static_cast<int64_t>(wire::load_le(b, 8));
}

std::string Client::recv_bytes(Clock::time_point deadline) {
  auto length = static_cast<uint64_t>(recv_i64(deadline));
  if (length > kMaxReplyBytes) {
    fail(Kind::kProtocol, "reply of " + std::to_string(length) + " bytes is implausible");
  }
  std::string out;
  constexpr size_t kChunk = 1 << 20;  // grow with the bytes that actually arrive
  while (out.size() < length) {
    size_t n = std::min<uint64_t>(kChunk, length - out.size());
    size_t at = out.size();
    out.resize(at + n);
    recv(out.data() + at, n, deadline);
  }
  return out;
}

void Client::await_release(std::chrono::milliseconds timeout, const std::string& what) {
  if (broken_) throw StoreError(Kind::kClosed, "store " + peer_ + ": connection closed");
  Status s = socket_io::wait_readable(fd_.get(), deadline_after(timeout));
  if (interrupted_) fail(Kind::kClosed, "interrupted");
  if (s == Status::kOk) {
    if (recv_u8(deadline()) != kStopWaiting) fail(Kind::kProtocol, "bad reply to " + what);
    return;
  }
  if (s != Status::kTimeout) fail(Kind::kClosed, "connection lost during " + what);
  // Cancel; if the release raced with us, 0x00 comes before the 0x01.
  send(frame(Op::kCancelWait), deadline());
  uint8_t reply = recv_u8(deadline());
  if (reply == kStopWaiting) reply = recv_u8(deadline());
  if (reply != kWaitCanceled) fail(Kind::kProtocol, "bad reply to CANCEL_WAIT");
  throw StoreError(Kind::kTimeout, "store " + peer_ + ": " + what + " timed out after " +
                                       std::to_string(timeout.count()) + " ms");
}

void Client::set(std::string_view key, std::string_view value) {
  send(client_frames::key_value_frame(Op::kSet, key, value), deadline());
}

std::string Client::get(std::string_view key) {
  return get(key, options_.timeout);
}

std::string Client::get(std::string_view key, std::chrono::milliseconds timeout) {
  wait({std::string(key)}, timeout);
  send(frame(Op::kGet, key), deadline());
  return recv_bytes(deadline());
}

int64_t Client::add(std::string_view key, int64_t delta) {
  send(client_frames::key_i64_frame(Op::kAdd, key, delta), deadline());
  return recv_i64(deadline());
}

std::string Client::compare_set(std::string_view key, std::string_view expected,
                                std::string_view desired) {
  send(client_frames::compare_set_frame(Op::kCompareSet, key, expected, desired), deadline());
  return recv_bytes(deadline());
}

bool Client::check(const std::vector<std::string>& keys) {
  send(frame_keys(Op::kCheck, keys), deadline());
  uint8_t reply = recv_u8(deadline());
  if (reply > kCheckNotReady) fail(Kind::kProtocol, "bad reply to CHECK");
  return reply == kCheckReady;
}

void Client::wait(const std::vector<std::string>& keys) {
  wait(keys, options_.timeout);
}

void Client::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  send(frame_keys(Op::kWait, keys), deadline());
  await_release(timeout, "WAIT");
}

int64_t Client::num_keys() {
  send(frame(Op::kGetNumKeys), deadline());
  return recv_i64(deadline());
}

bool Client::delete_key(std::string_view key) {
  send(frame(Op::kDeleteKey, key), deadline());
  return recv_i64(deadline()) == 1;
}

void Client::append(std::string_view key, std::string_view value) {
  send(client_frames::key_value_frame(Op::kAppend, key, value), deadline());
}

std::vector<std::string> Client::multi_get(const std::vector<std::string>& keys) {
  wait(keys);
  send(frame_keys(Op::kMultiGet, keys), deadline());
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) values.push_back(recv_bytes(deadline()));
  return values;
}

void Client::multi_set(const std::vector<std::pair<std::string, std::string>>& kvs) {
  send(client_frames::multi_set_frame(kvs), deadline());
}

void Client::queue_push(std::string_view key, std::string_view value) {
  send(client_frames::key_value_frame(Op::kQueuePush, key, value), deadline());
}

std::optional<std::string> Client::queue_pop(std::string_view key) {
  send(frame(Op::kQueuePop, key), deadline());
  if (recv_i64(deadline()) <= 0) return std::nullopt;
  return recv_bytes(deadline());
}

int64_t Client::queue_len(std::string_view key) {
  send(frame(Op::kQueueLen, key), deadline());
  return recv_i64(deadline());
}

std::vector<std::string> Client::list_keys() {
  send(frame(Op::kListKeys), deadline());
  int64_t count = recv_i64(deadline());
  if (count < 0) fail(Kind::kProtocol, "negative key count in LIST_KEYS reply");
  std::vector<std::string> keys;
  for (int64_t i = 0; i < count; ++i) keys.push_back(recv_bytes(deadline()));
  return keys;
}

void Client::barrier(std::string_view key, int64_t world_size, std::chrono::milliseconds timeout) {
  send(client_frames::key_i64_frame(Op::kBarrier, key, world_size), deadline());
  await_release(timeout, "BARRIER");
}

void Client::ping() {
  auto nonce = static_cast<uint32_t>(Clock::now().time_since_epoch().count());
  send(client_frames::ping_frame(nonce), deadline());
  char echo[4];
  recv(echo, 4, deadline());
  if (wire::load_le(echo, 4) != nonce) fail(Kind::kProtocol, "PING echoed a wrong nonce");
}

void Client::set_will(std::string_view key, std::string_view expected, std::string_view desired) {
  send(client_frames::compare_set_frame(Op::kSetWill, key, expected, desired), deadline());
  if (recv_u8(deadline()) != kExtensionAck) fail(Kind::kProtocol, "bad reply to SET_WILL");
}

void Client::keep_alive(std::chrono::milliseconds interval, int probes) {
  if (interval.count() <= 0 || probes < 1) {
    throw std::invalid_argument("keep_alive: interval and probes must be positive");
  }
  send(client_frames::keep_alive_frame(interval, probes), deadline());
  if (recv_u8(deadline()) != kExtensionAck) fail(Kind::kProtocol, "bad reply to KEEP_ALIVE");
  socket_io::set_keep_alive(fd_.get(), interval, probes);  // best effort on our side
}

void Client::interrupt() {
  interrupted_ = true;
  ::shutdown(fd_.get(), SHUT_RDWR);
}

}  // namespace ddprun::store
