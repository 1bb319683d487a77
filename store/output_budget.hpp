// How much memory replies waiting to be sent may hold, over all connections of a server.
//
// A request is small but its reply may not be: one GET of an 8 MiB value, a MULTI_GET naming
// that key 256 times, LIST_KEYS over a large map. A client that sends such requests and never
// reads the replies would make the server hold them all. So before a Session builds a reply it
// reserves the bytes (their size is known first: the values are already in the store). Each
// connection holds up to kFreeBytes without asking; beyond that it takes from this budget,
// shared by every connection of the server, and gives back as the replies are sent. A request
// that does not fit waits, with its connection's reading paused, until bytes come back (see
// session.hpp and connection.hpp).
//
// Thread-safe: replies are sent, and their bytes given back, on FanOut helper threads too.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ddprun::store {

class OutputBudget {
 public:
  // What a connection may hold without taking from the budget: ordinary traffic (addresses,
  // counters, a few KiB of state) never waits for it.
  static constexpr size_t kFreeBytes = 64 << 10;

  explicit OutputBudget(size_t limit) : limit_(limit) {}

  // Takes `bytes` if they fit under the limit; false (nothing taken) otherwise.
  bool try_take(size_t bytes) {
    size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (bytes > limit_ || used > limit_ - bytes) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }
  // Takes `bytes` whatever the limit: replies made without a reservation (a WAIT's release
  // moving held replies into the output buffer), bounded by what was reserved for them.
  void take(size_t bytes) { used_.fetch_add(bytes, std::memory_order_relaxed); }
  void give_back(size_t bytes) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    returns_.fetch_add(1, std::memory_order_relaxed);
  }
  // Changes whenever bytes come back: waiters need another try only then.
  uint64_t returns() const { return returns_.load(std::memory_order_relaxed); }

  size_t used() const { return used_.load(std::memory_order_relaxed); }
  size_t limit() const { return limit_; }

 private:
  std::atomic<size_t> used_{0};
  std::atomic<uint64_t> returns_{0};
  const size_t limit_;
};

}  // namespace ddprun::store
