// One client connection's protocol state, without the socket: parses its bytes, applies
// requests to the StoreState and queues the replies in request order. Connection (Asio)
// feeds it and sends what it queues; tests drive it directly.
//
// Ordering: a WAIT or BARRIER that cannot be answered yet parks the session; replies to
// requests that follow it are held back until its 0x00 goes out, so replies always leave in
// request order. On a 2.x connection CANCEL_WAIT drops the parked wait and replies 0x01 (after
// the 0x00 if that was already queued). A 1.13 client never sends while waiting unless it
// gave up (its timeout sends nothing), so there any new request cancels the parked wait and
// the late 0x00 is never sent (torch 1.13's own server desyncs the connection there).
//
// Back-pressure: before handling a request the session sizes its reply. It stops, keeping the
// request and the bytes after it, when the reply would take this connection's queued output
// past kMaxQueued, or needs more of the server's OutputBudget than is free (output_budget.hpp).
// paused() then holds until resume() succeeds; the Connection stops reading meanwhile, so a
// paused session holds at most one read's worth of input. A reply larger than the whole budget
// can never be sent: the connection is closed instead.
//
// Token (ddprun-only, PROTOCOL.md "AUTH"): with a non-empty token the connection must finish
// the AUTH exchange before anything else; until then the parser accepts only AUTH (and PING,
// answered with kAuthRequiredWord) and any other first request, a malformed AUTH frame or a
// wrong proof refuses the connection (feed() returns false, refused() says why).
//
// Multiplexed (ddprun-only, PROTOCOL.md "Multiplexed connections"): after MUX, every reply is
// framed, and tagged waits (WAIT_TAGGED, BARRIER_TAGGED) park without holding anything back:
// their release is a frame of its own, between any two replies. A store proxy forwards all its
// clients' requests, waits included, over one such connection.
//
// Not thread-safe: the io_context thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "store/frame_parser.hpp"
#include "store/output_budget.hpp"
#include "store/protocol.hpp"
#include "store/store_state.hpp"

namespace ddprun::store {

// Told when replies become ready outside feed(): a parked WAIT/BARRIER was released by
// another connection's request.
class OutputListener {
 public:
  virtual void on_output() = 0;
  // KEEP_ALIVE (ddprun-only): turn on TCP keep-alive for this connection's socket.
  virtual void on_keep_alive(int64_t interval_ms, uint32_t probes) {
    (void)interval_ms;
    (void)probes;
  }

 protected:
  ~OutputListener() = default;
};

class Session final : private Waiter {
 public:
  // A connection's reply memory (queued and held): past this, requests wait for the client.
  static constexpr size_t kMaxQueued = 4 << 20;

  // `state`, `listener`, `budget` and the token's bytes must outlive the session. An empty
  // token: the store is open (AUTH is answered kAuthOpen). No budget: only kMaxQueued applies.
  Session(StoreState& state, const Limits& limits, OutputListener& listener,
          std::string_view token = {}, OutputBudget* budget = nullptr);
  ~Session();  // gives its share of the budget back
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Processes received bytes, up to a request whose reply does not fit now (see above; the
  // rest is kept). Returns false when the connection must be closed: a malformed frame, an
  // impossible request (error() says why, in one line). Not to be called while paused().
  bool feed(std::string_view bytes);
  // Stopped before a request whose reply did not fit.
  bool paused() const { return rare_ && rare_->pending; }
  // Tries that request again (after replies were sent or budget was given back), then the
  // bytes kept after it. Returns false as feed() does; paused() says whether it stopped again.
  bool resume();
  // The connection is closed: what was queued is dropped and its budget given back.
  void discard_output();
  // Bytes this connection holds of the server's budget.
  size_t charged() const { return charged_; }
  // Requests handled so far (a resume() that handled none made no room).
  uint64_t requests_handled() const { return requests_; }
  const std::string& error() const;
  // When feed() returned false before the connection authenticated on a store with a token:
  // the refusal's short reason ("no token", "wrong token", "malformed AUTH"); else nullptr.
  // Replies queued by then (kAuthRequiredWord for a PING) are meant to be sent before closing.
  const char* refused() const { return refused_; }
  // A store with a token, and this connection has not finished AUTH yet.
  bool authenticating() const { return auth_ == Auth::kExpectAuth || auth_ == Auth::kChallenged; }
  // Challenged and no proof yet: a client that hangs up here rejected this store's proof (our
  // clients check it first), i.e. it holds a different token.
  bool challenged() const { return auth_ == Auth::kChallenged; }

  // Reply bytes ready to send, in order; after sending a prefix call consume_output(n).
  std::string_view output() const { return std::string_view(out_).substr(out_pos_); }
  void consume_output(size_t n);
  // Bytes queued or held back (for back-pressure on a client that does not read).
  size_t buffered() const { return out_.size() - out_pos_ + held_size(); }

  Dialect dialect() const { return parser_.dialect(); }
  bool waiting() const { return parked(); }

  // The connection ended (for any reason): applies its last will, if any, once (SET_WILL:
  // COMPARE_SET(key, expected, desired), waking waiters on the key).
  void fire_will();

  // Resumable multiplexed sessions (PROTOCOL.md, "Resuming a multiplexed connection"). A mux
  // session outlives its connection for a while (the server keeps it detached) and a new
  // connection may take it over: nothing it was sent is lost or applied twice.
  uint64_t mux_id() const;  // 0: not a multiplexed session
  // After feed(): the client's MUX asked to resume session `id`; `rest` holds the bytes that
  // came after it (they belong to that session). The connection then adopts it.
  struct ResumeRequest {
    uint64_t id = 0;
    uint64_t received = 0;  // stream bytes the client has received from that session
    std::string rest;
  };
  std::optional<ResumeRequest> take_resume_request();
  // Moves this (detached) session to another connection's listener: its output becomes the
  // MUX acknowledgement, then everything from the client's `received` on. False when the
  // session cannot resume from there (the client claims bytes it was never sent, or bytes
  // already dropped).
  bool attach(OutputListener& listener, uint64_t received);
  void detach(OutputListener& parked) { listener_ = &parked; }

 private:
  enum class Auth : uint8_t { kOpen, kExpectAuth, kChallenged, kDone };

  enum class Fit : uint8_t { kNow, kLater, kNever };
  // Runs the requests in `bytes`, stopping at one whose reply does not fit.
  bool run(std::string_view bytes);
  // Reserves room for `request`'s reply.
  Fit reserve(const Request& request);
  size_t reply_bytes(const Request& request) const;
  // Reply memory held now: the output buffer until it is wholly sent, and the replies held
  // behind a WAIT.
  size_t footprint() const;
  void settle_budget();  // charges the budget exactly the footprint beyond kFreeBytes
  bool handle(Request& request);
  bool dispatch(Request& request);  // handle()'s switch over the ops (session_ops.cpp)
  bool handle_auth(Request& request);
  // A multiplexed connection (after MUX): framed replies and tagged waits (session_mux.cpp).
  bool handle_muxed(Request& request);
  bool handle_tagged(Request& request);
  bool multi_wait_tagged(Request& request);
  bool park_tagged(const Request& request, uint32_t tag, const std::vector<std::string>& keys);
  void flush_releases();
  bool refuse(const char* reason, std::string detail);
  bool handle_read(Request& request);
  bool handle_write(Request& request);
  bool handle_wait(Request& request);
  bool fail(std::string reason);
  std::string& reply() { return parked() ? rare().held : out_; }
  size_t held_size() const { return rare_ ? rare_->held.size() : 0; }
  void release_held();
  void on_wake() override;

  StoreState& state_;
  FrameParser parser_;
  OutputListener* listener_;  // the connection's; rebound when a mux session moves
  std::string out_;
  size_t out_pos_ = 0;
  // What few sessions need, or need for a moment, kept off the inline size of every idle
  // connection's session: replies held behind a parked WAIT/BARRIER, the reason a session
  // failed, and the client's expected proof while it is challenged.
  struct Rare {
    std::string held;
    std::string error;
    std::string expected_proof;
    std::optional<Request> pending;  // paused before this request
    std::string pending_input;       // the bytes received after it
    std::optional<ResumeRequest> resume;
    bool idle() const {
      return held.empty() && error.empty() && expected_proof.empty() && !pending &&
             pending_input.empty() && !resume;
    }
  };
  Rare& rare();
  std::unique_ptr<Rare> rare_;
  struct Will {
    std::string key, expected, desired;
  };
  std::unique_ptr<Will> will_;  // few connections set one: not inline in every session
  struct Mux;
  struct TaggedWait;
  std::unique_ptr<Mux> mux_;  // a proxy's multiplexed connection (session_mux.cpp)
  std::string_view token_;
  OutputBudget* budget_;
  size_t charged_ = 0;  // taken from budget_ for this connection's output
  uint64_t requests_ = 0;
  const char* refused_ = nullptr;
  Auth auth_ = Auth::kOpen;
};

}  // namespace ddprun::store
