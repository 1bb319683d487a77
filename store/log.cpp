#include "store/log.hpp"

#include <unistd.h>

#include <string>

namespace ddprun::store {
namespace {

const std::string& host_pid() {
  static const std::string value = [] {
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    return std::string(host) + ":" + std::to_string(getpid());
  }();
  return value;
}

}  // namespace

void log_line(std::string_view prefix, std::string_view message) {
  std::string line;
  line.reserve(prefix.size() + message.size() + 48);
  line.append(prefix).append(" ").append(host_pid()).append(": ").append(message);
  line.push_back('\n');
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n <= 0) return;  // nothing sensible to do if stderr is gone
    done += static_cast<size_t>(n);
  }
}

}  // namespace ddprun::store
