#include "agent/process/guardian.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "store/sys/log.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent {
namespace {

// The guardian's whole life. Single-threaded copy of ddprun taken before any thread existed,
// so ordinary library calls are fine here.
[[noreturn]] void guardian_main(int read_fd) {
  ::setsid();
  ::prctl(PR_SET_NAME, "ddprun-guard");
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP && sig != SIGCHLD) ::signal(sig, SIG_IGN);
  }
  int devnull = ::open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
  }
  // Keep only the pipe: a guardian holding ddprun's stdout open would delay EOF for readers.
  if (read_fd != 3) ::dup2(read_fd, 3);
  ::syscall(SYS_close_range, 4, ~0U, 0);

  std::vector<pid_t> groups;
  int32_t buf[256];
  size_t have = 0;  // bytes in buf
  for (;;) {
    ssize_t n = ::read(3, reinterpret_cast<char*>(buf) + have, sizeof(buf) - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: ddprun is gone
    have += static_cast<size_t>(n);
    size_t records = have / sizeof(int32_t);
    for (size_t i = 0; i < records; ++i) {
      int32_t r = buf[i];
      if (r > 0) {
        groups.push_back(r);
      } else if (r < 0) {
        std::erase(groups, -r);
      }
    }
    size_t used = records * sizeof(int32_t);
    // Partial record (pipe writes of 4 bytes are atomic, so this does not happen in practice).
    std::memmove(buf, reinterpret_cast<char*>(buf) + used, have - used);
    have -= used;
  }
  for (pid_t g : groups) ::kill(-g, SIGKILL);
  ::_exit(0);
}

}  // namespace

std::unique_ptr<Guardian> Guardian::start() {
  sys::Pipe p = sys::make_pipe();
  pid_t pid = ::fork();
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork (guardian)");
  if (pid == 0) {
    p.write.reset();
    guardian_main(p.read.get());
  }
  p.read.reset();
  return std::unique_ptr<Guardian>(new Guardian(pid, std::move(p.write)));
}

Guardian::~Guardian() {
  pipe_.reset();
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

void Guardian::send(int32_t record) {
  if (!pipe_) return;
  ssize_t n;
  do {
    n = ::write(pipe_.get(), &record, sizeof(record));
  } while (n < 0 && errno == EINTR);
  if (n != sizeof(record) && !warned_) {
    warned_ = true;
    sys::log_line(
        "warning: the orphan guardian is gone; workers' children may outlive ddprun if it "
        "is killed");
  }
}

void Guardian::watch(pid_t pgid) {
  send(static_cast<int32_t>(pgid));
}
void Guardian::unwatch(pid_t pgid) {
  send(-static_cast<int32_t>(pgid));
}

}  // namespace ddprun::agent
