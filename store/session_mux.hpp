// Session's state on a multiplexed connection (a store proxy's; PROTOCOL.md "Multiplexed
// connections"): its parked tagged waits and the releases not yet framed. Internal to store/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "store/session.hpp"
#include "store/wait_registry.hpp"

namespace ddprun::store {

// One parked WAIT_TAGGED or BARRIER_TAGGED. Its wake only records the tag: a Waiter must not be
// destroyed from inside the registry's notify, so released ones are erased before the
// connection's next request.
struct Session::TaggedWait final : Waiter {
  TaggedWait(Session& session, uint32_t tag) : session(session), tag(tag) {}
  void on_wake() override;
  Session& session;
  uint32_t tag;
};

struct Session::Mux {
  // Sent stream bytes kept for a resume until the client says it has them (MUX_SYNC).
  static constexpr size_t kMaxUnacknowledged = 8 << 20;

  std::unordered_map<uint32_t, std::unique_ptr<TaggedWait>> waits;  // parked, or released
  std::vector<uint32_t> released;  // woken, not yet framed into the output
  std::vector<uint32_t> finished;  // woken: erased from `waits` before the next request
  bool in_request = false;         // a release during a request is framed after its reply

  // The two streams' positions (PROTOCOL.md, "Resuming a multiplexed connection").
  uint64_t id = 0;         // 0 once it can no longer be resumed
  bool streaming = false;  // the request stream has started (MUX handled)
  uint64_t in_bytes = 0;   // request stream bytes received (all kept: parsed or pending)
  std::string sent;        // output stream bytes sent, from sent_base on
  uint64_t sent_base = 0;  // output stream position of sent[0]
  size_t skip = 0;         // bytes at the front of the output that are not stream (acks)

  // The connection sent these output bytes.
  void sent_out(std::string_view bytes) {
    const size_t skipped = std::min(skip, bytes.size());
    skip -= skipped;
    if (id == 0) return;
    sent.append(bytes.substr(skipped));
    if (sent.size() > kMaxUnacknowledged) {  // a client that never says what it has
      id = 0;
      std::string().swap(sent);
    }
  }
};

}  // namespace ddprun::store
