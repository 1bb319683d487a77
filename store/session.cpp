// Session (session.hpp) around its requests: feeding and resuming, back-pressure against the
// output budget, the output buffer and the replies held behind a parked WAIT, failures, the
// last will and the AUTH exchange. handle() and the per-op handlers are in session_ops.cpp.
#include "store/session.hpp"

#include <algorithm>
#include <utility>

#include "store/auth.hpp"
#include "store/session_mux.hpp"
#include "store/wire.hpp"

namespace ddprun::store {
namespace {

// Reply buffers above this are released once drained, so an idle connection stays small.
constexpr size_t kKeepCapacity = 16 << 10;
// Replies held behind a pending WAIT (only a client pipelining behind its own WAIT, which no
// torch client does, can queue any): past this the connection is dropped.
constexpr size_t kMaxHeld = 64 << 20;

// Refusal reasons (the rate-limited log's keys).
constexpr const char* kNoToken = "no token";
constexpr const char* kWrongToken = "wrong token";
constexpr const char* kMalformedAuth = "malformed AUTH";

}  // namespace

Session::Session(StoreState& state, const Limits& limits, OutputListener& listener,
                 std::string_view token, OutputBudget* budget)
    : state_(state), parser_(limits), listener_(&listener), token_(token), budget_(budget) {
  if (token_.empty()) return;
  auth_ = Auth::kExpectAuth;
  parser_.allow_only({Op::kAuth, Op::kPing});
}

Session::~Session() {
  if (budget_ && charged_ > 0) budget_->give_back(charged_);
}

bool Session::feed(std::string_view bytes) {
  if (mux_ && mux_->streaming) mux_->in_bytes += bytes.size();
  return run(bytes);
}

bool Session::run(std::string_view bytes) {
  while (!bytes.empty()) {
    bytes.remove_prefix(parser_.feed(bytes));
    if (parser_.failed()) {
      if (auth_ == Auth::kExpectAuth && parser_.failed_at_opcode()) {
        return refuse(kNoToken, parser_.error());
      }
      if (authenticating()) return refuse(kMalformedAuth, parser_.error());
      return fail(parser_.error());
    }
    if (!parser_.ready()) continue;
    Request request = parser_.take();
    switch (reserve(request)) {
      case Fit::kNow:
        break;
      case Fit::kLater: {
        Rare& r = rare();
        r.pending = std::move(request);
        r.pending_input.assign(bytes);
        return true;
      }
      case Fit::kNever:
        return fail("a " + std::string(op_spec(request.op).name) + " whose reply of " +
                    std::to_string(reply_bytes(request)) +
                    " bytes exceeds the server's whole output budget of " +
                    std::to_string(budget_->limit()) + " bytes");
    }
    if (!handle(request)) return false;
    if (mux_ && !mux_->streaming) {
      mux_->streaming = true;  // the stream starts after MUX: what follows it counts
      mux_->in_bytes = bytes.size();
    }
    if (rare_ && rare_->resume) {
      rare_->resume->rest.assign(bytes);  // the resumed session's bytes
      return true;
    }
    settle_budget();
    if (held_size() > kMaxHeld) {
      return fail("over " + std::to_string(kMaxHeld >> 20) +
                  " MiB of replies held behind a pending WAIT");
    }
  }
  return true;
}

bool Session::resume() {
  if (!paused()) return true;
  Rare& r = rare();
  switch (reserve(*r.pending)) {
    case Fit::kNow:
      break;
    case Fit::kLater:
      return true;
    case Fit::kNever:
      return fail("a reply exceeds the server's whole output budget");
  }
  Request request = std::move(*r.pending);
  r.pending.reset();
  std::string rest;
  rest.swap(r.pending_input);
  if (!handle(request)) return false;
  settle_budget();
  return run(rest);
}

namespace {

// The capacity `s` will have once `add` more bytes are appended (an upper bound: libstdc++
// at least doubles a string that must grow).
size_t grown(const std::string& s, size_t add) {
  const size_t size = s.size() + add;
  return size <= s.capacity() ? s.capacity() : std::max(2 * s.capacity(), size);
}

// The memory a reply buffer holds: an empty one counts nothing (at most its small kept
// capacity, which the free allowance covers).
size_t memory_of(const std::string& s) {
  return s.empty() ? 0 : s.capacity();
}

}  // namespace

size_t Session::footprint() const {
  return memory_of(out_) + (rare_ ? memory_of(rare_->held) : 0);
}

// The reply of `r` fits: this connection's reply memory stays under kMaxQueued (one reply alone
// may be larger, when nothing else is held), and what goes beyond kFreeBytes is taken from the
// budget. Memory, not bytes queued: an output buffer is freed only once wholly sent.
Session::Fit Session::reserve(const Request& r) {
  const size_t need = reply_bytes(r) + (mux_ ? 1 : 0);  // a multiplexed reply's frame byte
  if (budget_ && need > budget_->limit()) return Fit::kNever;
  const size_t have = footprint();
  static const std::string kNothingHeld;
  const std::string& target = !parked() ? out_ : rare_ ? rare_->held : kNothingHeld;
  const size_t after = have - memory_of(target) + grown(target, need);
  if (have > 0 && after > kMaxQueued) return Fit::kLater;
  const size_t covered = OutputBudget::kFreeBytes + charged_;
  if (!budget_ || after <= covered) return Fit::kNow;
  const size_t extra = after - covered;
  if (!budget_->try_take(extra)) return Fit::kLater;
  charged_ += extra;
  return Fit::kNow;
}

// An upper bound of the reply's size, from what is in the store now.
size_t Session::reply_bytes(const Request& r) const {
  constexpr size_t kSmall = 16;  // a status byte, an integer, a PING's word
  constexpr size_t kLength = 8;  // a length-prefixed field's prefix
  auto value_size = [this](const std::string& key) {
    const std::string* v = state_.find(key);
    return v ? v->size() : 0;
  };
  switch (r.op) {
    case Op::kGet:
      return kLength + value_size(r.keys[0]);
    case Op::kMultiGet: {
      size_t n = 0;
      for (const std::string& key : r.keys) n += kLength + value_size(key);
      return n;
    }
    case Op::kCompareSet:
      return kLength + std::max({value_size(r.keys[0]), r.values[0].size(), r.values[1].size()});
    case Op::kQueuePop:
      return kSmall + kLength + state_.queue_front_size(r.keys[0]);
    case Op::kListKeys: {
      size_t n = kSmall;
      state_.for_each_key([&n](const std::string& key) { n += kLength + key.size(); });
      return n;
    }
    case Op::kAuth:
      return 128;  // a challenge: two nonces' worth
    default:
      return kSmall;
  }
}

void Session::consume_output(size_t n) {
  if (mux_) mux_->sent_out(std::string_view(out_).substr(out_pos_, n));
  out_pos_ += n;
  if (out_pos_ < out_.size()) {
    settle_budget();
    return;
  }
  out_pos_ = 0;
  if (out_.capacity() > kKeepCapacity) {
    std::string().swap(out_);
  } else {
    out_.clear();
  }
  settle_budget();
}

// Charges exactly what the replies hold beyond kFreeBytes: less once a buffer was sent and
// freed, more when replies were added without a reservation (a WAIT's release moving the replies
// held behind it into the output buffer, which may grow it).
void Session::settle_budget() {
  if (!budget_) return;
  const size_t have = footprint();
  const size_t needed = have > OutputBudget::kFreeBytes ? have - OutputBudget::kFreeBytes : 0;
  if (needed < charged_) {
    budget_->give_back(charged_ - needed);
  } else if (needed > charged_) {
    budget_->take(needed - charged_);
  }
  charged_ = needed;
}

void Session::discard_output() {
  std::string().swap(out_);
  out_pos_ = 0;
  if (rare_) {
    std::string().swap(rare_->held);
    rare_->pending.reset();
    std::string().swap(rare_->pending_input);
  }
  settle_budget();
}

bool Session::fail(std::string reason) {
  rare().error = std::move(reason);
  return false;
}

const std::string& Session::error() const {
  static const std::string kNone;
  return rare_ ? rare_->error : kNone;
}

Session::Rare& Session::rare() {
  if (!rare_) rare_ = std::make_unique<Rare>();
  return *rare_;
}

bool Session::refuse(const char* reason, std::string detail) {
  refused_ = reason;
  return fail(std::move(detail));
}

void Session::release_held() {
  if (!rare_) return;
  out_ += rare_->held;
  std::string().swap(rare_->held);
  if (rare_->idle()) rare_.reset();
}

void Session::fire_will() {
  if (!will_) return;
  if (parked()) state_.cancel_wait(*this);  // the connection is gone: nobody to wake here
  Will w = std::move(*will_);
  will_.reset();
  state_.compare_set(std::move(w.key), w.expected, std::move(w.desired));
}

void Session::on_wake() {
  wire::put_u8(out_, kStopWaiting);
  release_held();
  settle_budget();
  listener_->on_output();
}

// Before a connection to a store with a token has authenticated: the parser lets only AUTH,
// AUTH_PROOF (once challenged) and PING through.
bool Session::handle_auth(Request& r) {
  switch (r.op) {
    case Op::kPing:  // a client without a token (ours, torch 2.x): tell it why, then close
      wire::put_u32(out_, kAuthRequiredWord);
      return refuse(kNoToken, "PING before AUTH");
    case Op::kAuth: {
      const std::string server_nonce = auth::nonce();
      wire::put_u8(out_, kAuthChallenge);
      wire::put_bytes(out_, server_nonce);
      wire::put_bytes(out_, auth::server_proof(token_, r.values[0], server_nonce));
      rare().expected_proof = auth::client_proof(token_, server_nonce, r.values[0]);
      auth_ = Auth::kChallenged;
      parser_.allow_only({Op::kAuthProof});
      return true;
    }
    case Op::kAuthProof:
      if (!auth::same(r.values[0], rare().expected_proof)) {
        return refuse(kWrongToken, "AUTH_PROOF does not match the token");
      }
      std::string().swap(rare().expected_proof);
      auth_ = Auth::kDone;
      parser_.allow_all();
      wire::put_u8(out_, kExtensionAck);
      return true;
    default:
      return refuse(kNoToken, std::string(op_spec(r.op).name) + " before AUTH");
  }
}

}  // namespace ddprun::store
