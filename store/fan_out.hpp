// Runs one job's independent items on the calling thread and a few helper threads, and returns
// when every item is done: the store's way to spread the sends of a mass wake-up (one SET
// releasing thousands of parked WAITs) over the machine's cores. The kernel's TCP send path is
// nearly all of that wake-up's cost, and sends on different sockets do not contend.
//
// The helpers start on the first job big enough to need them and then sleep between jobs; a
// process that never has such a job never starts them. One caller at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ddprun::store::detail {

class FanOut {
 public:
  // `helpers` threads at most beside the caller; 0 runs every job on the caller.
  explicit FanOut(size_t helpers);
  ~FanOut();
  FanOut(const FanOut&) = delete;
  FanOut& operator=(const FanOut&) = delete;

  // Helper threads for this machine: one fewer than its cores, at most 7.
  static size_t default_helpers();
  size_t helpers() const { return helpers_; }

  // Calls item(i) for every i in [0, n), each exactly once, in any order and on any of the
  // threads; returns when all calls have returned. `item` must not throw.
  void run(size_t n, const std::function<void(size_t)>& item);

 private:
  void helper_main();
  void work();

  const size_t helpers_;
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> threads_;
  const std::function<void(size_t)>* item_ = nullptr;  // the job; guarded by mutex_
  size_t count_ = 0;
  std::atomic<size_t> next_{0};
  size_t busy_ = 0;   // helpers still on the current job
  uint64_t job_ = 0;  // bumped per job: wakes the helpers
  bool stopping_ = false;
};

}  // namespace ddprun::store::detail
