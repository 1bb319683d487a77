// FileTimers: the FileTimer service's table of countdown timers, keyed like torch's server by
// (pid, scope_id), each already resolved to the watched worker it belongs to and converted to a
// steady-clock deadline. Pure bookkeeping: the Watchdog owns the one steady_timer, armed at
// earliest().
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::agent {

class FileTimers {
 public:
  using Clock = std::chrono::steady_clock;

  struct Expired {
    size_t worker = 0;  // index of the worker in the Watchdog's table
    pid_t pid = 0;      // the pid that asked
    std::string scope;
    int signal = 0;
    Clock::time_point deadline;
  };

  // Acquires (or moves) the (pid, scope) timer.
  void set(pid_t pid, std::string scope, Clock::time_point deadline, int signal, size_t worker);
  // Releases the (pid, scope) timer; no-op if there is none.
  void release(pid_t pid, const std::string& scope);
  // Forgets every timer of a worker (whichever of its processes asked).
  void drop_worker(size_t worker);
  void clear() { timers_.clear(); }

  std::optional<Clock::time_point> earliest() const;
  size_t size() const { return timers_.size(); }

  // One entry per worker with a timer due at `now`, chosen as torch's server chooses: among its
  // expired timers in deadline order, the first that asks for a signal > 0, else the first.
  // Every timer of those workers is dropped.
  std::vector<Expired> take_expired(Clock::time_point now);

 private:
  struct Timer {
    Clock::time_point deadline;
    int signal = 0;
    size_t worker = 0;
  };
  std::map<std::pair<pid_t, std::string>, Timer> timers_;
};

}  // namespace ddprun::agent
