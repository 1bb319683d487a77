// The store's data: the key-value map, the FIFO queues and the parked waiters, with the
// semantics of PyTorch's TCPStore servers. No I/O: Session turns requests into calls here.
// Single-threaded (the server's io_context thread).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "store/wait_registry.hpp"

namespace ddprun::store {

// Parses a stored counter the way torch's std::stoll does: leading spaces, an optional sign,
// digits; trailing bytes ignored. nullopt if there is no number or it overflows int64.
std::optional<int64_t> parse_counter(std::string_view text);

class StoreState {
 public:
  // SET: insert or overwrite; wakes waiters on the key.
  void set(std::string key, std::string value);
  // COMPARE_SET, returning the reply: absent + expected empty -> store desired, reply
  // desired; absent + expected non-empty -> reply expected; present and equal -> store
  // desired, reply desired; present and different -> reply the current value.
  std::string compare_set(std::string key, const std::string& expected, std::string desired);
  const std::string* find(const std::string& key) const;
  // ADD: the counter at key (0 when absent) plus delta, stored as ASCII decimal; wakes
  // waiters. nullopt (store unchanged) if the value is not a number or the sum overflows.
  std::optional<int64_t> add(const std::string& key, int64_t delta);
  // CHECK: every key is in the map or names a non-empty queue.
  bool check(const std::vector<std::string>& keys) const;
  // WAIT: true if check(keys) holds now; otherwise parks `waiter` on the missing keys.
  bool wait(const std::vector<std::string>& keys, Waiter& waiter);
  void cancel_wait(Waiter& waiter) { waiters_.cancel(waiter); }
  int64_t num_keys() const { return static_cast<int64_t>(map_.size()); }
  // DELETE_KEY (waiters are not woken, as in torch).
  bool erase(const std::string& key) { return map_.erase(key) > 0; }
  // APPEND: concatenate or create; wakes waiters.
  void append(std::string key, std::string_view data);

  void queue_push(std::string key, std::string value);
  // QUEUE_POP: the queue's length before the pop, and the popped value if it was non-empty.
  std::pair<int64_t, std::string> queue_pop(const std::string& key);
  int64_t queue_len(const std::string& key) const;
  // The size of the value QUEUE_POP would return (0 for an empty queue).
  size_t queue_front_size(const std::string& key) const;

  template <typename F>
  void for_each_key(F&& f) const {
    for (const auto& [key, value] : map_) f(key);
  }

  enum class BarrierResult { kReleased, kWaiting, kBadCounter };
  // BARRIER: +1 on the counter at key; released (and earlier arrivals woken) once it
  // reaches world_size, else `waiter` is parked on the key.
  BarrierResult barrier(const std::string& key, int64_t world_size, Waiter& waiter);

  size_t parked_key_count() const { return waiters_.parked_key_count(); }

 private:
  bool present(const std::string& key) const;

  std::unordered_map<std::string, std::string> map_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  WaitRegistry waiters_;  // declared last: destroyed first, while the maps still exist
};

}  // namespace ddprun::store
