// The log of refused connections (no token, a wrong token, a peer not on the allow-list): one
// line per refusal, but at most one per second for each reason, so a port scanner or a
// misconfigured node retrying in a loop cannot flood the log. Lines held back are counted
// into the next line for that reason.
//
// Not thread-safe: the server's io_context thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace ddprun::store {

class RefusalLog {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RefusalLog(std::string tag) : tag_(std::move(tag)) {}

  // Logs "<tag> host:pid refused <peer>: <reason>" unless a line with this reason went out
  // less than a second ago (then it is counted). Returns whether a line was written.
  bool refused(const std::string& peer, const std::string& reason,
               Clock::time_point now = Clock::now());

 private:
  struct Entry {
    Clock::time_point last{};
    uint64_t held = 0;  // refusals since `last` that were not logged
  };
  std::string tag_;
  std::map<std::string, Entry> reasons_;  // a handful: one per distinct reason
};

}  // namespace ddprun::store
