#include "store/refusal_log.hpp"

#include "store/sys/log.hpp"

namespace ddprun::store {

bool RefusalLog::refused(const std::string& peer, const std::string& reason,
                         Clock::time_point now) {
  Entry& e = reasons_[reason];
  if (e.last != Clock::time_point{} && now - e.last < std::chrono::seconds(1)) {
    ++e.held;
    return false;
  }
  std::string line = "refused " + peer + ": " + reason;
  if (e.held > 0) {
    line += " (and " + std::to_string(e.held) + " more for the same reason since the last line)";
  }
  e.last = now;
  e.held = 0;
  sys::log_line(tag_, line);
  return true;
}

}  // namespace ddprun::store
