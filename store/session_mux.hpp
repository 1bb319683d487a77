// Session's state on a multiplexed connection (a store proxy's; PROTOCOL.md "Multiplexed
// connections"): its parked tagged waits and the releases not yet framed. Internal to store/.
#pragma once

#include <cstdint>
#include <memory>
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
  std::unordered_map<uint32_t, std::unique_ptr<TaggedWait>> waits;  // parked, or released
  std::vector<uint32_t> released;  // woken, not yet framed into the output
  std::vector<uint32_t> finished;  // woken: erased from `waits` before the next request
  bool in_request = false;         // a release during a request is framed after its reply
};

}  // namespace ddprun::store
