#include "agent/process/child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "store/sys/fd.hpp"
#include "store/sys/fd_limit.hpp"

namespace ddprun::agent {
namespace {

// Async-signal-safe helpers for the child between fork and exec.
void child_write(const char* s) {
  (void)!::write(STDERR_FILENO, s, ::strlen(s));
}

// Where the child reports a failed execve's errno to the agent (a close-on-exec pipe).
int g_exec_error_fd = -1;

[[noreturn]] void child_fail(const char* what, const char* path) {
  int err = errno;
  (void)!::write(g_exec_error_fd, &err, sizeof err);
  child_write("[ddprun] cannot execute ");
  child_write(path);
  child_write(": ");
  child_write(what);
  child_write(": ");
  const char* desc = ::strerrordesc_np(err);
  child_write(desc ? desc : "unknown error");
  child_write("\n");
  ::_exit(127);
}

void close_from(int first) {
  if (::syscall(SYS_close_range, first, ~0U, 0) == 0) return;
  for (int fd = first; fd < 65536; ++fd) ::close(fd);  // kernels without close_range
}

[[noreturn]] void run_child(const SpawnRequest& req, pid_t parent, const sigset_t& mask,
                            const struct sigaction& dfl) {
  for (int sig : req.reset_signals) ::sigaction(sig, &dfl, nullptr);
  if (::setsid() < 0) child_fail("setsid", req.path);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail("prctl", req.path);
  if (::getppid() != parent) ::_exit(128 + SIGKILL);  // the agent died before prctl
  // Under Yama ptrace_scope=1 only ancestors may ptrace; declaring the agent as this worker's
  // ptracer also admits its children, the stack dump tools (stack_dump.hpp). The setting
  // survives execve. EINVAL without Yama: ignored.
  (void)::prctl(PR_SET_PTRACER, parent, 0, 0, 0);
  if (req.stdout_fd >= 0 && ::dup2(req.stdout_fd, STDOUT_FILENO) < 0) child_fail("dup2", req.path);
  if (req.stderr_fd >= 0 && ::dup2(req.stderr_fd, STDERR_FILENO) < 0) child_fail("dup2", req.path);
  // Out of the way of 3 and 4 first: the passed descriptor may be either.
  const int passed = req.pass_fd >= 0 ? ::fcntl(req.pass_fd, F_DUPFD, 10) : -1;
  if (req.pass_fd >= 0 && passed < 0) child_fail("fcntl", req.path);
  // Keep the error pipe (close-on-exec) just above stderr, then the passed descriptor, close
  // everything else.
  if (::dup3(g_exec_error_fd, 3, O_CLOEXEC) == 3) g_exec_error_fd = 3;
  if (passed >= 0 && ::dup2(passed, 4) != 4) child_fail("dup2", req.path);
  close_from(passed >= 0 ? 5 : g_exec_error_fd == 3 ? 4 : 3);
  sys::restore_fd_limit_in_child();  // the agent's store raised it for itself, not for workers
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
  ::execve(req.path, req.argv, req.envp);
  child_fail("execve", req.path);
}

// Blocks every signal for the lifetime of the object (restores the old mask after).
class BlockAllSignals {
 public:
  BlockAllSignals() {
    sigset_t all;
    ::sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old_);
  }
  ~BlockAllSignals() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  const sigset_t& old() const { return old_; }

 private:
  sigset_t old_;
};

}  // namespace

ChildProcess ChildProcess::spawn(const SpawnRequest& request) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigemptyset(&dfl.sa_mask);
  const pid_t parent = ::getpid();
  sys::Pipe exec_error = sys::make_pipe();
  ::fcntl(exec_error.read.get(), F_SETFL, O_NONBLOCK);
  pid_t pid;
  {
    // No signal handler may run in the child before its dispositions are reset.
    BlockAllSignals blocked;
    pid = ::fork();
    if (pid == 0) {
      g_exec_error_fd = exec_error.write.get();
      run_child(request, parent, blocked.old(), dfl);
    }
  }
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
  // glibc 2.36's <sys/pidfd.h> lacks extern "C"; call the system call directly.
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    int err = errno;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    throw std::system_error(err, std::generic_category(), "pidfd_open");
  }
  return ChildProcess(pid, sys::UniqueFd(fd), std::move(exec_error.read));
}

ChildProcess ChildProcess::adopt(pid_t pid, sys::UniqueFd pidfd, ChildReaper* reaper) {
  ChildProcess child(pid, std::move(pidfd), sys::UniqueFd());
  child.reaper_ = reaper;
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      pidfd_(std::move(other.pidfd_)),
      exec_error_(std::move(other.exec_error_)),
      reaped_(std::exchange(other.reaped_, true)),
      reaper_(other.reaper_) {}

ChildProcess::~ChildProcess() {
  if (pid_ <= 0 || reaped_) return;
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);  // in case it had not yet become a group leader
  if (reaper_) {
    uint64_t peak_rss_kb = 0;
    reaper_->reap(pid_, peak_rss_kb);
    return;
  }
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

bool ChildProcess::has_exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  int n;
  while ((n = ::poll(&p, 1, 0)) < 0 && errno == EINTR) {
  }
  return n > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

void ChildProcess::signal_group(int sig) const {
  if (pid_ <= 0 || reaped_) return;
  if (::kill(-pid_, sig) != 0 && errno == ESRCH) ::kill(pid_, sig);
}

ExitStatus ChildProcess::reap() {
  if (reaper_) {
    reaped_ = true;
    return reaper_->reap(pid_, peak_rss_kb_);
  }
  siginfo_t info{};
  // Peek first: the zombie keeps the group id reserved while we kill the rest of the group.
  while (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  ::kill(-pid_, SIGKILL);
  struct rusage usage {};
  int wstatus = 0;
  while (::wait4(pid_, &wstatus, 0, &usage) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  peak_rss_kb_ = static_cast<uint64_t>(usage.ru_maxrss);
  int err = 0;
  if (exec_error_ && ::read(exec_error_.get(), &err, sizeof err) == sizeof err) {
    return ExitStatus::exec_failed(err);
  }
  if (info.si_code == CLD_EXITED) return ExitStatus::exited(info.si_status);
  return ExitStatus::signaled(info.si_status);  // CLD_KILLED / CLD_DUMPED
}

}  // namespace ddprun::agent
