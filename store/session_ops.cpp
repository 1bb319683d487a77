// Session's request handlers (session.hpp): handle() dispatches each parsed request by op (one
// that comes before AUTH is finished goes to handle_auth, in session.cpp) and the handlers apply
// it to the StoreState and queue its reply: reads, writes, WAIT/BARRIER/CANCEL_WAIT, VALIDATE
// and the ddprun-only ops.
#include <optional>
#include <string>
#include <utility>

#include "store/session.hpp"
#include "store/wire.hpp"

namespace ddprun::store {
namespace {

std::string quoted(const std::string& key) {
  constexpr size_t kMax = 64;
  std::string out = "'";
  for (char c : key.substr(0, kMax)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out + (key.size() > kMax ? "...'" : "'");
}

}  // namespace

bool Session::handle(Request& request) {
  ++requests_;
  if (authenticating()) return handle_auth(request);
  if (mux_) return handle_muxed(request);
  if (parked()) {
    if (dialect() == Dialect::kTorch1) {
      state_.cancel_wait(*this);  // the 1.13 client gave up on it: never send the late byte
    } else if (request.op == Op::kWait || request.op == Op::kBarrier) {
      return fail(std::string(op_spec(request.op).name) +
                  " while this connection's previous WAIT is still pending");
    }
  }
  return dispatch(request);
}

bool Session::dispatch(Request& request) {
  switch (request.op) {
    case Op::kValidate:
      if (request.word != kValidationMagic) return fail("VALIDATE with a wrong magic number");
      return true;
    case Op::kWait:
    case Op::kBarrier:
    case Op::kCancelWait:
      return handle_wait(request);
    case Op::kSetWill:
      if (request.keys[0].empty()) {
        will_.reset();
      } else {
        will_ =
            std::make_unique<Will>(Will{std::move(request.keys[0]), std::move(request.values[0]),
                                        std::move(request.values[1])});
      }
      wire::put_u8(reply(), kExtensionAck);
      return true;
    case Op::kKeepAlive:
      if (request.integer <= 0 || request.word == 0) {
        return fail("KEEP_ALIVE with interval " + std::to_string(request.integer) + " ms and " +
                    std::to_string(request.word) + " probes");
      }
      listener_->on_keep_alive(request.integer, request.word);
      wire::put_u8(reply(), kExtensionAck);
      return true;
    case Op::kAuth:
      if (auth_ == Auth::kDone) return fail("AUTH on a connection that has authenticated");
      wire::put_u8(reply(), kAuthOpen);  // the client decides whether an open store will do
      return true;
    case Op::kAuthProof:
      return fail(auth_ == Auth::kDone ? "AUTH_PROOF on a connection that has authenticated"
                                       : "AUTH_PROOF on a store without a token");
    case Op::kMux:
    case Op::kWaitTagged:
    case Op::kBarrierTagged:
    case Op::kCancelTagged:
    case Op::kMuxSync:
    case Op::kMultiWaitTagged:
      return handle_tagged(request);
    case Op::kSet:
    case Op::kCompareSet:
    case Op::kAdd:
    case Op::kDeleteKey:
    case Op::kAppend:
    case Op::kMultiSet:
    case Op::kQueuePush:
    case Op::kQueuePop:
      return handle_write(request);
    default:
      return handle_read(request);
  }
}

bool Session::handle_read(Request& r) {
  std::string& out = reply();
  switch (r.op) {
    case Op::kGet: {
      // Clients WAIT before GET; a key deleted in between reads as empty, like torch 2.x.
      const std::string* value = state_.find(r.keys[0]);
      wire::put_bytes(out, value ? *value : std::string_view());
      return true;
    }
    case Op::kMultiGet:
      for (const std::string& key : r.keys) {
        const std::string* value = state_.find(key);
        wire::put_bytes(out, value ? *value : std::string_view());
      }
      return true;
    case Op::kCheck:
      wire::put_u8(out, state_.check(r.keys) ? kCheckReady : kCheckNotReady);
      return true;
    case Op::kGetNumKeys:
      wire::put_i64(out, state_.num_keys());
      return true;
    case Op::kWatchKey:  // 1.13: acknowledge, never notify (nothing in torch relies on it)
      wire::put_u8(out, kWatchRegistered);
      return true;
    case Op::kPing:
      wire::put_u32(out, r.word);
      return true;
    case Op::kQueueLen:
      wire::put_i64(out, state_.queue_len(r.keys[0]));
      return true;
    case Op::kListKeys:
      wire::put_i64(out, state_.num_keys());
      state_.for_each_key([&out](const std::string& key) { wire::put_bytes(out, key); });
      return true;
    default:
      return fail(std::string("unexpected ") + op_spec(r.op).name);
  }
}

bool Session::handle_write(Request& r) {
  switch (r.op) {
    case Op::kSet:
      state_.set(std::move(r.keys[0]), std::move(r.values[0]));
      return true;
    case Op::kCompareSet: {
      // The state first: the write may release this session's own WAIT, which moves where
      // reply() points (held replies go out behind the wake byte).
      const std::string value =
          state_.compare_set(std::move(r.keys[0]), r.values[0], std::move(r.values[1]));
      wire::put_bytes(reply(), value);
      return true;
    }
    case Op::kAdd: {
      std::optional<int64_t> sum = state_.add(r.keys[0], r.integer);
      if (!sum) {
        return fail("ADD " + std::to_string(r.integer) + " on key " + quoted(r.keys[0]) +
                    " whose value is not a 64-bit decimal integer (or the sum overflows)");
      }
      wire::put_i64(reply(), *sum);
      return true;
    }
    case Op::kDeleteKey: {
      const bool erased = state_.erase(r.keys[0]);
      wire::put_i64(reply(), erased ? 1 : 0);
      return true;
    }
    case Op::kAppend:
      state_.append(std::move(r.keys[0]), r.values[0]);
      return true;
    case Op::kMultiSet:
      for (size_t i = 0; i < r.keys.size(); ++i) {
        state_.set(std::move(r.keys[i]), std::move(r.values[i]));
      }
      return true;
    case Op::kQueuePush:
      state_.queue_push(std::move(r.keys[0]), std::move(r.values[0]));
      return true;
    case Op::kQueuePop: {
      auto [length, value] = state_.queue_pop(r.keys[0]);
      std::string& out = reply();
      wire::put_i64(out, length);
      if (length > 0) wire::put_bytes(out, value);
      return true;
    }
    default:
      return fail(std::string("unexpected ") + op_spec(r.op).name);
  }
}

bool Session::handle_wait(Request& r) {
  switch (r.op) {
    case Op::kWait:
      if (state_.wait(r.keys, *this)) wire::put_u8(out_, kStopWaiting);
      return true;  // else parked: on_wake() sends the 0x00
    case Op::kBarrier:
      switch (state_.barrier(r.keys[0], r.integer, *this)) {
        case StoreState::BarrierResult::kReleased:
          wire::put_u8(out_, kStopWaiting);
          return true;
        case StoreState::BarrierResult::kWaiting:
          return true;
        case StoreState::BarrierResult::kBadCounter:
          return fail("BARRIER on key " + quoted(r.keys[0]) +
                      " whose value is not a 64-bit decimal integer");
      }
      return true;
    case Op::kCancelWait:
      if (parked()) {
        state_.cancel_wait(*this);
        release_held();
      }
      wire::put_u8(out_, kWaitCanceled);
      return true;
    default:
      return fail(std::string("unexpected ") + op_spec(r.op).name);
  }
}

}  // namespace ddprun::store
