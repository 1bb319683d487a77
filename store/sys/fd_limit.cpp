#include "store/sys/fd_limit.hpp"

#include <sys/resource.h>

#include <cerrno>
#include <fstream>

namespace ddprun::sys {
namespace {

rlimit g_original{};
bool g_raised = false;

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line.empty() ? "?" : line;
}

}  // namespace

void raise_fd_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return;
  const rlimit original = lim;
  lim.rlim_cur = lim.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &lim) == 0) {
    g_original = original;
    g_raised = true;
  }
}

void restore_fd_limit_in_child() {
  if (g_raised) ::setrlimit(RLIMIT_NOFILE, &g_original);
}

std::string accept_failure_text(const boost::system::error_code& ec) {
  std::string text = ec.message();
  switch (ec.value()) {
    case EMFILE: {
      rlimit lim{};
      ::getrlimit(RLIMIT_NOFILE, &lim);
      return text + ": this process's open-file limit (RLIMIT_NOFILE) of " +
             std::to_string(lim.rlim_cur) + " is reached; raise it (ulimit -n, LimitNOFILE=)";
    }
    case ENFILE:
      return text + ": the system's open-file limit (fs.file-max, " +
             read_first_line("/proc/sys/fs/file-max") + ") is reached";
    case ENOBUFS:
    case ENOMEM:
      return text + ": the kernel is out of memory for sockets";
    default:
      return text;
  }
}

}  // namespace ddprun::sys
