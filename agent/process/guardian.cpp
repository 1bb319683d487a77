#include "agent/process/guardian.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "agent/process/child_process.hpp"
#include "agent/process/proc_stat.hpp"
#include "store/sys/fd.hpp"
#include "store/sys/log.hpp"
#include "store/sys/signal_names.hpp"

extern char** environ;

namespace ddprun::agent {
namespace {

constexpr int32_t kRemoveRecord = INT32_MIN;  // no process group id is that
// Set in the guardian's environment only: the descriptor of its pipe.
constexpr const char* kPipeVariable = "DDPRUN_GUARDIAN_PIPE";
constexpr char kName[] = "orphan-guardian";  // its command line and process name

Guardian::ExitAction g_exit_action = nullptr;  // run_if_guardian's, for a guardian not exec'd

// Rewrites this process's command line (what /proc/<pid>/cmdline shows, within the room its
// original one had) as `orphan-guardian <ddprun's pid>`, argv-style, for a guardian that was
// not executed under that name.
void retitle() {
  const auto fields = proc_stat_fields(0);
  constexpr size_t kArgStart = 48 - 3, kArgEnd = 49 - 3;  // proc(5)'s 1-based numbers
  if (fields.size() <= kArgEnd) return;
  char* start = reinterpret_cast<char*>(std::strtoull(fields[kArgStart].c_str(), nullptr, 10));
  char* end = reinterpret_cast<char*>(std::strtoull(fields[kArgEnd].c_str(), nullptr, 10));
  if (start == nullptr || end <= start) return;
  std::string title = std::string(kName) + '\0' + std::to_string(::getppid());
  const size_t room = static_cast<size_t>(end - start);
  std::memset(start, 0, room);
  std::memcpy(start, title.data(), std::min(title.size(), room - 1));
}

// A session of its own, its name, every signal but SIGKILL/SIGSTOP/SIGCHLD ignored, stdio on
// /dev/null, and only the pipe (as fd 3) kept: a guardian holding ddprun's stdout open would
// delay EOF for readers.
void become_guardian(int read_fd) {
  ::setsid();
  ::prctl(PR_SET_NAME, kName);
  retitle();
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP && sig != SIGCHLD) ::signal(sig, SIG_IGN);
  }
  int devnull = ::open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
  }
  if (read_fd != 3) ::dup2(read_fd, 3);
  ::syscall(SYS_close_range, 4, ~0U, 0);
}

// What ddprun told the guardian so far.
struct Orders {
  std::vector<pid_t> groups;
  std::string exit_request;
  std::string remove_dir;
};

// Records: int32 > 0 watches a process group, < 0 unwatches it; 0 and kRemoveRecord are
// followed by an int32 length and that many bytes: the exit request, the directory to remove.
// Applies the whole records at the front of `in` and returns how many bytes they took.
size_t apply_records(const std::string& in, Orders& orders) {
  size_t at = 0;
  for (;;) {
    int32_t r;
    if (in.size() - at < sizeof r) break;
    std::memcpy(&r, in.data() + at, sizeof r);
    if (r == 0 || r == kRemoveRecord) {
      int32_t len;
      if (in.size() - at < 2 * sizeof r) break;
      std::memcpy(&len, in.data() + at + sizeof r, sizeof len);
      if (len < 0 || in.size() - at - 2 * sizeof r < static_cast<size_t>(len)) break;
      (r == 0 ? orders.exit_request : orders.remove_dir)
          .assign(in, at + 2 * sizeof r, static_cast<size_t>(len));
      at += 2 * sizeof r + static_cast<size_t>(len);
      continue;
    }
    if (r > 0) {
      orders.groups.push_back(r);
    } else {
      std::erase(orders.groups, -r);
    }
    at += sizeof r;
  }
  return at;
}

// The guardian's whole life: a single-threaded process (executed afresh, or forked from a
// ddprun that had no other thread).
[[noreturn]] void guardian_main(int read_fd, Guardian::ExitAction action) {
  become_guardian(read_fd);
  Orders orders;
  std::string in;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(3, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: ddprun is gone
    in.append(buf, static_cast<size_t>(n));
    in.erase(0, apply_records(in, orders));
  }
  // The exit request first (within 1 s): the other nodes then learn of this node's end
  // (its etcd lease revoked) before its workers' sockets close under their collectives,
  // which would count as a worker failure and spend a restart.
  if (action && !orders.exit_request.empty()) action(orders.exit_request, std::chrono::seconds(1));
  for (pid_t g : orders.groups) ::kill(-g, SIGKILL);
  if (!orders.remove_dir.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(orders.remove_dir, ignored);
  }
  ::_exit(0);
}

}  // namespace

void Guardian::run_if_guardian(ExitAction action) {
  g_exit_action = action;
  const char* fd = std::getenv(kPipeVariable);
  if (fd == nullptr) return;
  const int read_fd = std::atoi(fd);
  ::unsetenv(kPipeVariable);
  guardian_main(read_fd, action);
}

std::unique_ptr<Guardian> Guardian::start() {
  std::unique_ptr<Guardian> g(new Guardian());
  g->launch(true);
  return g;
}

void Guardian::launch(bool exec) {
  sys::Pipe p = sys::make_pipe();
  // Everything the child needs, built before the fork: it only makes system calls.
  std::string name(kName);
  std::string ddprun_pid = std::to_string(::getpid());
  std::string variable = std::string(kPipeVariable) + "=3";
  std::vector<char*> argv{name.data(), ddprun_pid.data(), nullptr};
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) envp.push_back(*e);
  envp.push_back(variable.data());
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork (guardian)");
  if (pid == 0) {
    // The pipe as descriptor 3 (dup2 clears close-on-exec), nothing else of ddprun's.
    const int fd = p.read.get();
    if (fd == 3 ? ::fcntl(3, F_SETFD, 0) != 0 : ::dup2(fd, 3) != 3) ::_exit(127);
    ::syscall(SYS_close_range, 4, ~0U, 0);
    if (exec) ::execve("/proc/self/exe", argv.data(), envp.data());
    guardian_main(3, g_exit_action);  // no /proc: this copy of ddprun does the work
  }
  p.read.reset();
  launched_ = std::chrono::steady_clock::now();
  exec_ = exec;
  pid_ = pid;
  pipe_ = std::move(p.write);
  warned_ = false;
  // A replacement learns what its predecessor knew.
  if (!exit_request_.empty()) send_text(0, exit_request_);
  if (!remove_dir_.empty()) send_text(kRemoveRecord, remove_dir_);
  for (pid_t g : groups_) send(static_cast<int32_t>(g));
}

Guardian::~Guardian() {
  if (pidfd_) {
    boost::system::error_code ignored;
    pidfd_->close(ignored);
  }
  pipe_.reset();
  while (pid_ > 0 && ::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

void Guardian::keep(boost::asio::io_context& io) {
  io_ = &io;
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (fd < 0) return;  // gone already, or no pidfds: the first write says so
  pidfd_ = std::make_unique<boost::asio::posix::stream_descriptor>(io, fd);
  await_exit();
}

void Guardian::await_exit() {
  pidfd_->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                     [this](boost::system::error_code ec) {
                       if (ec) return;
                       if (!ChildProcess::has_exited(pidfd_->native_handle())) {
                         await_exit();  // another descriptor's readiness
                         return;
                       }
                       on_exit();
                     });
}

void Guardian::on_exit() {
  boost::system::error_code ignored;
  pidfd_->close(ignored);
  pidfd_.reset();
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  const pid_t old = pid_;
  const std::string how = WIFSIGNALED(status)
                              ? "was killed (" + sys::signal_name(WTERMSIG(status)) + ")"
                              : "exited with " + std::to_string(WEXITSTATUS(status));
  // One that died at once was not working: an executed one is retried as a plain copy of
  // ddprun (the binary /proc/self/exe names may be a wrapper's, valgrind's or ld.so's); a
  // copy that dies at once too is not replaced (no loop).
  const bool at_once = std::chrono::steady_clock::now() - launched_ < std::chrono::seconds(1);
  std::string why;
  if (at_once && !exec_) {
    why = "it died as it started";
  } else {
    try {
      launch(exec_ && !at_once);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  if (!why.empty()) {
    pid_ = -1;
    pipe_.reset();
    sys::log_line("warning: the orphan guardian (pid " + std::to_string(old) + ") " + how +
                  " and is not replaced (" + why +
                  "): workers' children may outlive ddprun if it is killed");
    return;
  }
  sys::log_line("warning: the orphan guardian (pid " + std::to_string(old) + ") " + how +
                "; a new one (pid " + std::to_string(pid_) + ") took over");
  keep(*io_);
}

void Guardian::send(int32_t record) {
  send_bytes(reinterpret_cast<const char*>(&record), sizeof record);
}

void Guardian::send_bytes(const char* data, size_t size) {
  if (!pipe_) return;
  bool ok = true;
  while (size > 0) {
    ssize_t n = ::write(pipe_.get(), data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      break;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  if (!ok && !warned_ && !pidfd_) {  // kept: on_exit says what happens
    warned_ = true;
    sys::log_line(
        "warning: the orphan guardian is gone; workers' children may outlive ddprun if it "
        "is killed");
  }
}

void Guardian::watch(pid_t pgid) {
  groups_.insert(pgid);
  send(static_cast<int32_t>(pgid));
}
void Guardian::unwatch(pid_t pgid) {
  groups_.erase(pgid);
  send(-static_cast<int32_t>(pgid));
}

void Guardian::set_exit_request(const std::string& request) {
  exit_request_ = request;
  send_text(0, request);
}

void Guardian::remove_at_exit(const std::string& directory) {
  remove_dir_ = directory;
  send_text(kRemoveRecord, directory);
}

void Guardian::send_text(int32_t kind, const std::string& text) {
  std::string record(2 * sizeof(int32_t), '\0');
  const int32_t len = static_cast<int32_t>(text.size());
  std::memcpy(record.data(), &kind, sizeof kind);
  std::memcpy(record.data() + sizeof(int32_t), &len, sizeof len);
  record += text;
  send_bytes(record.data(), record.size());
}

}  // namespace ddprun::agent
