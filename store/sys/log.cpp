#include "store/sys/log.hpp"

#include <unistd.h>

#include "store/sys/console.hpp"

namespace ddprun::sys {

const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof(buf) - 1) != 0) return std::string("localhost");
    return std::string(buf);
  }();
  return name;
}

void log_line(std::string_view tag, std::string_view message) {
  static const std::string host_pid = host_name() + ":" + std::to_string(::getpid());
  std::string line;
  line.reserve(tag.size() + host_pid.size() + message.size() + 3);
  line.append(tag).append(" ").append(host_pid).append(" ").append(message);
  line.push_back('\n');
  Console::write(STDERR_FILENO, line, LineKind::kOwn);
}

}  // namespace ddprun::sys
