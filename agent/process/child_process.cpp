#include "agent/process/child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <system_error>

#include "store/sys/fd.hpp"
#include "store/sys/fd_limit.hpp"

namespace ddprun::agent {
namespace {

// Async-signal-safe helpers for the child between clone and exec.
void child_write(const char* s) {
  (void)!::write(STDERR_FILENO, s, ::strlen(s));
}

[[noreturn]] void child_fail(int exec_error_fd, const char* what, const char* path) {
  int err = errno;
  (void)!::write(exec_error_fd, &err, sizeof err);
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

// What the child needs, prepared by the parent: the child shares the parent's memory
// (CLONE_VM) and must write none of it.
struct ChildArgs {
  const SpawnRequest* req;
  pid_t parent;
  sigset_t mask;  // the parent's signal mask, to restore before exec
  struct sigaction dfl;
  int exec_error_fd;  // write end of a close-on-exec pipe: a failed execve's errno
};

// The child, between clone and execve: system calls only (no allocation, no lock, nothing
// written to the shared memory but this stack).
int run_child(void* arg) {
  const ChildArgs& a = *static_cast<const ChildArgs*>(arg);
  const SpawnRequest& req = *a.req;
  int exec_error_fd = a.exec_error_fd;
  for (int sig : req.reset_signals) ::sigaction(sig, &a.dfl, nullptr);
  if (::setsid() < 0) child_fail(exec_error_fd, "setsid", req.path);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail(exec_error_fd, "prctl", req.path);
  if (::getppid() != a.parent) ::_exit(128 + SIGKILL);  // the agent died before prctl
  // Under Yama ptrace_scope=1 only ancestors may ptrace; declaring the agent as this worker's
  // ptracer also admits its children, the stack dump tools (stack_dump.hpp). The setting
  // survives execve. EINVAL without Yama: ignored.
  (void)::prctl(PR_SET_PTRACER, a.parent, 0, 0, 0);
  if (req.stdin_fd >= 0 && ::dup2(req.stdin_fd, STDIN_FILENO) < 0) {
    child_fail(exec_error_fd, "dup2", req.path);
  }
  if (req.stdout_fd >= 0 && ::dup2(req.stdout_fd, STDOUT_FILENO) < 0) {
    child_fail(exec_error_fd, "dup2", req.path);
  }
  if (req.stderr_fd >= 0 && ::dup2(req.stderr_fd, STDERR_FILENO) < 0) {
    child_fail(exec_error_fd, "dup2", req.path);
  }
  // Out of the way of 3 and 4 first: the passed descriptor may be either.
  const int passed = req.pass_fd >= 0 ? ::fcntl(req.pass_fd, F_DUPFD, 10) : -1;
  if (req.pass_fd >= 0 && passed < 0) child_fail(exec_error_fd, "fcntl", req.path);
  // Keep the error pipe (close-on-exec) just above stderr, then the passed descriptor, close
  // everything else.
  if (::dup3(exec_error_fd, 3, O_CLOEXEC) == 3) exec_error_fd = 3;
  if (passed >= 0 && ::dup2(passed, 4) != 4) child_fail(exec_error_fd, "dup2", req.path);
  close_from(passed >= 0 ? 5 : exec_error_fd == 3 ? 4 : 3);
  sys::restore_fd_limit_in_child();  // the agent's store raised it for itself, not for workers
  ::sigprocmask(SIG_SETMASK, &a.mask, nullptr);
  ::execve(req.path, req.argv, req.envp);
  child_fail(exec_error_fd, "execve", req.path);
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
  ChildArgs args{};
  args.req = &request;
  args.parent = ::getpid();
  args.dfl.sa_handler = SIG_DFL;
  ::sigemptyset(&args.dfl.sa_mask);
  sys::Pipe exec_error = sys::make_pipe();
  ::fcntl(exec_error.read.get(), F_SETFL, O_NONBLOCK);
  args.exec_error_fd = exec_error.write.get();
  // The child runs on its own stack in the agent's memory, and the agent waits until it has
  // called execve (CLONE_VFORK): no copy of the agent's page tables, whose cost grows with the
  // agent's memory (the tee buffers of 2,000 workers made each fork cost milliseconds), and no
  // moment in which the child holds the agent's descriptors while the agent runs on.
  constexpr size_t kStack = 64 * 1024;
  std::unique_ptr<char[]> stack(new char[kStack]);
  pid_t pid;
  {
    // No signal handler may run in the child before its dispositions are reset.
    BlockAllSignals blocked;
    args.mask = blocked.old();
    pid = ::clone(run_child, stack.get() + kStack, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
  }
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "clone");
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
