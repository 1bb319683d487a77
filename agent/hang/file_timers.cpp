#include "agent/hang/file_timers.hpp"

#include <algorithm>

namespace ddprun::agent {

void FileTimers::set(pid_t pid, std::string scope, Clock::time_point deadline, int signal,
                     size_t worker) {
  timers_[{pid, std::move(scope)}] = Timer{deadline, signal, worker};
}

void FileTimers::release(pid_t pid, const std::string& scope) {
  // A short-lived key for lookup; requests are rare enough that the copy does not matter.
  timers_.erase({pid, scope});
}

void FileTimers::drop_worker(size_t worker) {
  std::erase_if(timers_, [worker](const auto& entry) { return entry.second.worker == worker; });
}

std::optional<FileTimers::Clock::time_point> FileTimers::earliest() const {
  std::optional<Clock::time_point> first;
  for (const auto& [key, timer] : timers_) {
    if (!first || timer.deadline < *first) first = timer.deadline;
  }
  return first;
}

std::vector<FileTimers::Expired> FileTimers::take_expired(Clock::time_point now) {
  std::vector<Expired> due;
  for (const auto& [key, timer] : timers_) {
    if (timer.deadline <= now) {
      due.push_back({timer.worker, key.first, key.second, timer.signal, timer.deadline});
    }
  }
  std::stable_sort(due.begin(), due.end(),
                   [](const Expired& a, const Expired& b) { return a.deadline < b.deadline; });
  std::vector<Expired> chosen;
  for (auto& timer : due) {
    auto same = std::find_if(chosen.begin(), chosen.end(),
                             [&](const Expired& c) { return c.worker == timer.worker; });
    if (same == chosen.end()) {
      chosen.push_back(std::move(timer));
    } else if (same->signal <= 0 && timer.signal > 0) {
      *same = std::move(timer);
    }
  }
  for (const auto& c : chosen) drop_worker(c.worker);
  return chosen;
}

}  // namespace ddprun::agent
