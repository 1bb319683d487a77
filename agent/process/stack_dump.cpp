#include "agent/process/stack_dump.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <system_error>
#include <utility>

#include "agent/process/child_process.hpp"
#include "agent/process/exit_status.hpp"
#include "agent/process/proc_stat.hpp"
#include "agent/process/stack_text.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;
using namespace asio::experimental::awaitable_operators;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);
using stack_text::clip;
using stack_text::split_lines;
using stack_text::trim;
constexpr size_t kMaxToolOutput = 16 << 20;  // read back for `head`; real dumps are KBs

// One tool run: what to execute and how the file introduces it.
struct Tool {
  std::string name;  // "eu-stack", for notes
  std::vector<std::string> argv;
  std::string title;    // the header line's text
  bool ptraces = true;  // attaches (stops the worker for a moment), unlike py-spy --nonblocking
};

// A running tool and its process group (its own session), until reaped. Destroying one that
// was not reaped SIGKILLs the group and reaps it (blocking; SIGKILL is immediate).
class ToolProcess {
 public:
  ~ToolProcess() {
    if (pid_ <= 0 || reaped_) return;
    kill_group();
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }

  // Starts argv[0] (a path) with stdin on /dev/null, stdout and stderr on `out_fd`, no other
  // descriptor, default signal dispositions, nothing blocked. Returns 0 or an errno (glibc's
  // posix_spawn also reports a failed execve).
  int start(std::vector<std::string> argv, int out_fd) {
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawnattr_init(&attr);
    ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    ::posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
    ::posix_spawn_file_actions_adddup2(&actions, out_fd, STDERR_FILENO);
#if __GLIBC_PREREQ(2, 34)
    ::posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
#endif  // older: every descriptor ddprun opens is close-on-exec anyway
    sigset_t none, all;
    ::sigemptyset(&none);
    ::sigfillset(&all);
    ::posix_spawnattr_setsigmask(&attr, &none);
    ::posix_spawnattr_setsigdefault(&attr, &all);
    ::posix_spawnattr_setflags(&attr,
                               POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    int err = ::posix_spawn(&pid_, args[0], &actions, &attr, args.data(), environ);
    ::posix_spawnattr_destroy(&attr);
    ::posix_spawn_file_actions_destroy(&actions);
    if (err != 0) {
      pid_ = -1;
      return err;
    }
    int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (fd < 0) return errno;  // the destructor kills and reaps it
    pidfd_ = sys::UniqueFd(fd);
    return 0;
  }

  sys::UniqueFd take_pidfd() {
    return std::move(pidfd_);
  }
  void kill_group() const {
    if (pid_ <= 0 || reaped_) return;
    if (::kill(-pid_, SIGKILL) != 0) ::kill(pid_, SIGKILL);
  }

  // Call once the pidfd was readable (or after kill_group). Kills what the tool left in its
  // group while the unreaped leader still reserves the group id, then reaps.
  ExitStatus reap() {
    kill_group();
    siginfo_t info{};
    while (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    if (info.si_code == CLD_EXITED) return ExitStatus::exited(info.si_status);
    return ExitStatus::signaled(info.si_status);
  }

 private:
  pid_t pid_ = -1;
  sys::UniqueFd pidfd_;
  bool reaped_ = false;
};

// The worker, through a pidfd so that a signal can never reach a process that reused its pid.
class Target {
 public:
  explicit Target(pid_t pid) : pid_(pid) {
    pidfd_ = sys::UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  }
  bool gone() const { return !pidfd_ || ChildProcess::has_exited(pidfd_.get()); }
  // The state letter of /proc/PID/stat ('S', 'T', 'Z'...), '?' if unreadable.
  char state() const {
    const auto fields = proc_stat_fields(pid_);
    return fields.empty() || fields[0].empty() ? '?' : fields[0][0];
  }
  void resume() const { ::syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGCONT, nullptr, 0); }

 private:
  pid_t pid_;
  sys::UniqueFd pidfd_;
};

std::string duration_text(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + " s";
  return std::to_string(d.count()) + " ms";
}

void append(int fd, const std::string& text) {
  sys::write_all(fd, text.data(), text.size());
}

std::string read_tail_from(int fd, off_t begin) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= begin) return {};
  std::string out(std::min(static_cast<size_t>(st.st_size - begin), kMaxToolOutput), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::pread(fd, out.data() + got, out.size() - got, begin + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

std::optional<std::string> find_on_path(const std::string& name, std::string_view search_path) {
  while (!search_path.empty()) {
    auto colon = search_path.find(':');
    std::string dir(search_path.substr(0, colon));
    search_path = colon == std::string_view::npos ? "" : search_path.substr(colon + 1);
    if (dir.empty()) continue;  // "" means the current directory: never for a tool
    std::string candidate = dir + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return std::nullopt;
}

std::optional<Tool> native_tool(pid_t pid, std::string_view search_path) {
  const std::string p = std::to_string(pid);
  if (auto eu = find_on_path("eu-stack", search_path)) {
    return Tool{"eu-stack", {*eu, "-p", p}, "eu-stack -p " + p + " (native, every thread)"};
  }
  if (auto gdb = find_on_path("gdb", search_path)) {
    return Tool{"gdb",
                {*gdb, "-batch", "-nx", "-p", p, "-ex", "thread apply all bt"},
                "gdb -batch -nx -p " + p + " -ex 'thread apply all bt' (native, every thread)"};
  }
  return std::nullopt;
}

std::optional<Tool> python_tool(pid_t pid, std::string_view search_path) {
  const std::string p = std::to_string(pid);
  if (auto spy = find_on_path("py-spy", search_path)) {
    return Tool{"py-spy",
                {*spy, "dump", "--pid", p, "--nonblocking"},
                "py-spy dump --pid " + p + " --nonblocking (Python)",
                false};
  }
  return std::nullopt;
}

// ": <the first line of `output` that reads like an error>" (for a note), or "".
std::string error_line(std::string_view output) {
  for (std::string_view line : split_lines(output)) {
    for (std::string_view word : {"rror", "denied", "not permitted", "No such process"}) {
      if (line.find(word) != std::string_view::npos) return ": " + clip(trim(line));
    }
  }
  return {};
}

// What a tool run left: its output (for `head`) and whether it ended on its own, successfully.
struct ToolRun {
  std::string output;
  bool success = false;
};

// Runs one tool into `file` under `timeout`; failures become notes and file lines.
asio::awaitable<ToolRun> run_tool(asio::any_io_executor ex, Tool tool, int file,
                                  std::chrono::milliseconds timeout, const Target& target,
                                  std::vector<std::string>& notes) {
  ToolRun run;
  append(file, "=== " + tool.title + " ===\n");
  const off_t begin = ::lseek(file, 0, SEEK_END);
  const char before = target.state();
  ToolProcess proc;
  if (int err = proc.start(tool.argv, file); err != 0) {
    std::string note = "cannot run " + tool.argv[0] + ": " + ::strerror(err);
    append(file, "=== " + note + " ===\n");
    notes.push_back(std::move(note));
    co_return run;
  }
  asio::posix::stream_descriptor exited(ex, proc.take_pidfd().release());
  asio::steady_timer deadline(ex, timeout);
  bool timed_out = false;
  // A readiness is checked: it may be another descriptor's (ChildProcess::has_exited).
  while (!timed_out && !ChildProcess::has_exited(exited.native_handle())) {
    auto first =
        co_await (exited.async_wait(asio::posix::stream_descriptor::wait_read, kUseTuple) ||
                  deadline.async_wait(kUseTuple));
    timed_out = first.index() == 1;
  }
  if (timed_out) {
    proc.kill_group();
    while (!ChildProcess::has_exited(exited.native_handle())) {
      auto [ec] = co_await exited.async_wait(asio::posix::stream_descriptor::wait_read, kUseTuple);
      if (ec) break;
    }
  }
  const ExitStatus status = proc.reap();
  run.output = read_tail_from(file, begin);
  run.success = !timed_out && status.success();
  std::string problem;
  if (timed_out) {
    problem = tool.name + " timed out after " + duration_text(timeout);
  } else if (!status.success()) {
    problem = tool.name + " " + status.describe() + error_line(run.output);
  }
  if (!problem.empty()) {
    const char* newline = run.output.empty() || run.output.back() == '\n' ? "" : "\n";
    append(file, newline + ("=== " + problem + (timed_out ? ": killed ===\n" : " ===\n")));
    notes.push_back(std::move(problem));
  }
  // A tracer killed between PTRACE_ATTACH and its detach can leave a SIGSTOP pending, which
  // SIGCONT discards. A worker found stopped stays stopped.
  const bool killed = timed_out || status.kind != ExitStatus::Kind::kExited;
  if (tool.ptraces && before != 'T' && !target.gone() && (killed || target.state() == 'T')) {
    target.resume();
  }
  co_return run;
}

}  // namespace

asio::awaitable<StackDump> dump_stacks(asio::any_io_executor ex, pid_t pid, std::string path,
                                       std::chrono::milliseconds timeout) {
  StackDumpOptions options;
  options.timeout = timeout;
  co_return co_await dump_stacks(std::move(ex), pid, std::move(path), std::move(options));
}

asio::awaitable<StackDump> dump_stacks(asio::any_io_executor ex, pid_t pid, std::string path,
                                       StackDumpOptions options) {
  const auto start = Clock::now();
  StackDump dump;
  dump.path = std::move(path);
  int fd = ::open(dump.path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw std::system_error(errno, std::generic_category(), "cannot create " + dump.path);
  }
  sys::UniqueFd file(fd);
  std::string search_path = "/usr/bin:/bin";
  if (options.search_path) {
    search_path = *options.search_path;
  } else if (const char* env = std::getenv("PATH")) {
    search_path = env;
  }
  const Target target(pid);
  std::vector<std::string> native, python;
  std::string native_output, python_output;
  auto missing = [&](std::string note) {
    append(file.get(), "=== " + note + " ===\n");
    dump.notes.push_back(std::move(note));
  };

  const bool exited_before = target.gone();
  if (exited_before) {
    missing("process " + std::to_string(pid) + " has exited: no stacks");
  } else if (auto tool = native_tool(pid, search_path)) {
    ToolRun run =
        co_await run_tool(ex, std::move(*tool), file.get(), options.timeout, target, dump.notes);
    native_output = std::move(run.output);
    native = native_stack_head(native_output, pid);
  } else {
    missing("no native stack tool on PATH: install elfutils (eu-stack) or gdb");
  }

  if (target.gone()) {
    if (!exited_before) missing("process " + std::to_string(pid) + " exited during the dump");
  } else if (auto tool = python_tool(pid, search_path)) {
    ToolRun run =
        co_await run_tool(ex, std::move(*tool), file.get(), options.timeout, target, dump.notes);
    if (run.success) {
      python_output = std::move(run.output);
      python = python_stack_head(python_output, pid);
    }
  } else {
    missing("py-spy not installed: no Python stacks (pip install py-spy)");
  }

  dump.head = python.empty() ? std::move(native) : std::move(python);
  dump.place = stack_place(native_output, python_output, pid);
  dump.took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  co_return dump;
}

}  // namespace ddprun::agent
