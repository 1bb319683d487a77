#include "agent/log.hpp"

#include <unistd.h>

#include "agent/unique_fd.hpp"

namespace ddprun::agent {
namespace {
bool quiet = false;
}

const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof(buf) - 1) != 0) return std::string("localhost");
    return std::string(buf);
  }();
  return name;
}

const std::string& log_prefix() {
  static const std::string prefix = "[ddprun] " + host_name() + ":" + std::to_string(::getpid());
  return prefix;
}

void log_line(std::string_view message) {
  if (quiet) return;
  std::string line;
  line.reserve(log_prefix().size() + message.size() + 2);
  line += log_prefix();
  line += ' ';
  line += message;
  line += '\n';
  write_all(STDERR_FILENO, line.data(), line.size());
}

void set_log_quiet(bool q) {
  quiet = q;
}

}  // namespace ddprun::agent
