// Session on a multiplexed connection (session.hpp, session_mux.hpp): MUX turns it on; then
// every reply is framed (kMuxReply + the reply), and tagged waits park without holding back the
// replies behind them, their release framed as kMuxRelease + tag between any two replies.
#include "store/session_mux.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "store/sys/random.hpp"
#include "store/wire.hpp"

namespace ddprun::store {
namespace {

// Ops whose reply a multiplexed connection frames; the others reply nothing.
bool has_reply(Op op) {
  switch (op) {
    case Op::kValidate:
    case Op::kSet:
    case Op::kAppend:
    case Op::kMultiSet:
    case Op::kQueuePush:
    case Op::kWaitTagged:  // its release is a frame of its own
    case Op::kMultiWaitTagged:
    case Op::kBarrierTagged:
      return false;
    default:
      return true;
  }
}

}  // namespace

void Session::TaggedWait::on_wake() {
  Mux& mux = *session.mux_;
  mux.released.push_back(tag);
  mux.finished.push_back(tag);
  if (mux.in_request) return;  // framed after the reply being built
  session.flush_releases();
  session.listener_->on_output();
}

uint64_t Session::mux_id() const {
  return mux_ ? mux_->id : 0;
}

std::optional<Session::ResumeRequest> Session::take_resume_request() {
  if (!rare_ || !rare_->resume) return std::nullopt;
  std::optional<ResumeRequest> r = std::move(rare_->resume);
  rare_->resume.reset();
  if (rare_->idle()) rare_.reset();
  return r;
}

bool Session::attach(OutputListener& listener, uint64_t received) {
  if (!mux_ || mux_->id == 0) return false;
  Mux& mux = *mux_;
  if (received < mux.sent_base || received > mux.sent_base + mux.sent.size()) return false;
  std::string out;
  wire::put_u8(out, kExtensionAck);
  wire::put_i64(out, static_cast<int64_t>(mux.id));
  wire::put_i64(out, static_cast<int64_t>(mux.in_bytes));
  const size_t header = out.size();
  out.append(mux.sent, static_cast<size_t>(received - mux.sent_base));  // lost on the way
  // Not sent yet: the stream, after what of an earlier answer (or pre-MUX replies) had not
  // left either; that was for a connection that is gone.
  out.append(out_, std::min(out_.size(), out_pos_ + mux.skip));
  out_ = std::move(out);
  out_pos_ = 0;
  mux.sent.clear();
  mux.sent_base = received;
  mux.skip = header;
  listener_ = &listener;
  settle_budget();
  return true;
}

void Session::flush_releases() {
  for (uint32_t tag : mux_->released) {
    wire::put_u8(out_, kMuxRelease);
    wire::put_u32(out_, tag);
  }
  mux_->released.clear();
  settle_budget();
}

bool Session::handle_muxed(Request& request) {
  Mux& mux = *mux_;
  for (uint32_t tag : mux.finished) mux.waits.erase(tag);
  mux.finished.clear();
  switch (request.op) {
    case Op::kWait:
    case Op::kBarrier:
    case Op::kCancelWait:
    case Op::kMux:
      return fail(std::string(op_spec(request.op).name) + " on a multiplexed connection");
    case Op::kMuxSync:
      wire::put_u8(out_, kMuxReply);
      return handle_tagged(request);
    default:
      break;
  }
  const size_t mark = out_.size();
  if (has_reply(request.op)) wire::put_u8(out_, kMuxReply);
  mux.in_request = true;
  bool ok = dispatch(request);
  mux.in_request = false;
  if (!ok && (request.op == Op::kAdd || request.op == Op::kBarrierTagged)) {
    // Refused by the store's semantics, not a broken frame: this request fails, not the link.
    out_.resize(mark);
    if (request.op == Op::kAdd) {
      wire::put_u8(out_, kMuxFailed);
    } else {
      wire::put_u8(out_, kMuxTagFailed);
      wire::put_u32(out_, request.word);
    }
    wire::put_bytes(out_, error());
    rare_->error.clear();
    if (rare_->idle()) rare_.reset();
    ok = true;
  }
  flush_releases();
  return ok;
}

// MUX, and the tagged ops (which only a multiplexed connection may send).
bool Session::handle_tagged(Request& r) {
  if (r.op == Op::kMux) {
    if (parked()) return fail("MUX while a WAIT is pending");
    if (r.integer != 0) {  // resume that session: the connection adopts it after this feed
      rare().resume = ResumeRequest{static_cast<uint64_t>(r.integer),
                                    static_cast<uint64_t>(r.integer2), std::string()};
      return true;
    }
    mux_ = std::make_unique<Mux>();
    do {
      sys::random_bytes(reinterpret_cast<unsigned char*>(&mux_->id), sizeof mux_->id);
    } while (mux_->id == 0 || static_cast<int64_t>(mux_->id) < 0);
    wire::put_u8(out_, kExtensionAck);
    wire::put_i64(out_, static_cast<int64_t>(mux_->id));
    wire::put_i64(out_, 0);
    mux_->skip = out_.size() - out_pos_;  // replies so far and this ack are not stream
    return true;
  }
  if (!mux_) return fail(std::string(op_spec(r.op).name) + " before MUX");
  Mux& mux = *mux_;
  if (r.op == Op::kMuxSync) {
    const uint64_t received = static_cast<uint64_t>(r.integer);
    if (received > mux.sent_base) {
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(received - mux.sent_base, mux.sent.size()));
      mux.sent.erase(0, n);
      mux.sent_base += n;
    }
    wire::put_i64(out_, static_cast<int64_t>(mux.in_bytes));
    return true;
  }
  const uint32_t tag = r.word;
  if (r.op == Op::kCancelTagged) {
    auto it = mux.waits.find(tag);
    const bool parked_now = it != mux.waits.end() && it->second->parked();
    if (parked_now) {
      state_.cancel_wait(*it->second);
      mux.waits.erase(it);
    }
    wire::put_u8(out_, parked_now ? kMuxCancelled : kMuxNotParked);
    return true;
  }
  if (r.op == Op::kMultiWaitTagged) return multi_wait_tagged(r);
  return park_tagged(r, tag, r.keys);
}

// MULTI_WAIT_TAGGED: the waits of one proxy turn in one frame, each as its own WAIT_TAGGED.
bool Session::multi_wait_tagged(Request& r) {
  const std::string& counts = r.values[0];
  const size_t n = counts.size() / 4;
  if (counts.size() % 4 != 0 || n == 0 || n > kMaxTaggedWaits) {
    return fail("MULTI_WAIT_TAGGED with " + std::to_string(counts.size()) + " bytes of counts");
  }
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += wire::load_le(counts.data() + 4 * i, 4);
  if (total != r.keys.size()) {
    return fail("MULTI_WAIT_TAGGED counting " + std::to_string(total) + " keys of " +
                std::to_string(r.keys.size()));
  }
  auto from = r.keys.begin();
  for (size_t i = 0; i < n; ++i) {
    auto to = from + static_cast<std::ptrdiff_t>(wire::load_le(counts.data() + 4 * i, 4));
    const std::vector<std::string> keys(std::make_move_iterator(from), std::make_move_iterator(to));
    if (!park_tagged(r, r.word + static_cast<uint32_t>(i), keys)) return false;
    from = to;
  }
  return true;
}

// One tagged wait (a WAIT_TAGGED on `keys`, or the BARRIER_TAGGED `r`): released now, or parked.
bool Session::park_tagged(const Request& r, uint32_t tag, const std::vector<std::string>& keys) {
  Mux& mux = *mux_;
  if (mux.waits.count(tag) != 0) {
    return fail("tag " + std::to_string(tag) + " of a wait that is still parked");
  }
  if (mux.waits.size() >= kMaxTaggedWaits) {
    return fail("over " + std::to_string(kMaxTaggedWaits) + " tagged waits parked");
  }
  auto wait = std::make_unique<TaggedWait>(*this, tag);
  bool released = false;
  if (r.op != Op::kBarrierTagged) {
    released = state_.wait(keys, *wait);
  } else {
    switch (state_.barrier(r.keys[0], r.integer, *wait)) {
      case StoreState::BarrierResult::kReleased:
        released = true;
        break;
      case StoreState::BarrierResult::kWaiting:
        break;
      case StoreState::BarrierResult::kBadCounter:
        return fail("BARRIER_TAGGED on a key whose value is not a 64-bit decimal integer");
    }
  }
  if (released) {
    mux.released.push_back(tag);
  } else {
    mux.waits.emplace(tag, std::move(wait));
  }
  return true;
}

}  // namespace ddprun::store
