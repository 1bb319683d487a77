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
#include "store/sys/fd.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;
using namespace asio::experimental::awaitable_operators;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);
constexpr size_t kMaxToolOutput = 16 << 20;  // read back for `head`; real dumps are KBs
constexpr size_t kMaxHeadLineChars = 160;

// --- text ---

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r") + 1 - first);
}

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    auto nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

std::string clip(std::string_view s) {
  if (s.size() <= kMaxHeadLineChars) return std::string(s);
  return std::string(s.substr(0, kMaxHeadLineChars)) + "...";
}

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
  bool gone() const {
    if (!pidfd_) return true;
    pollfd p{pidfd_.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;  // readable once it exited (or an error)
  }
  // The state letter of /proc/PID/stat ('S', 'T', 'Z'...), '?' if unreadable.
  char state() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
    std::string s((std::istreambuf_iterator<char>(in)), {});
    auto close = s.rfind(')');
    return close != std::string::npos && s.size() > close + 2 ? s[close + 2] : '?';
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

// --- parsing `head` ---

// The index of the first line for which `better` is true, else of the first for which `any`.
template <typename Better, typename Any>
std::optional<size_t> pick_block(const std::vector<std::string_view>& lines, Better better,
                                 Any any) {
  std::optional<size_t> fallback;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!any(lines[i])) continue;
    if (better(lines[i])) return i;
    if (!fallback) fallback = i;
  }
  return fallback;
}

// "#3  0x00007f... in foo (a=1) at x.c:5" (gdb) or "#3  0x00007f... foo" (eu-stack) -> "#3 foo".
std::string native_frame(std::string_view line) {
  auto space = line.find_first_of(" \t");
  std::string number(line.substr(0, space));
  std::string_view rest = space == std::string_view::npos ? "" : trim(line.substr(space));
  if (rest.starts_with("0x")) {
    auto end = rest.find_first_of(" \t");
    rest = end == std::string_view::npos ? "" : trim(rest.substr(end));
    if (rest.starts_with("in ")) rest = trim(rest.substr(3));
  }
  rest = rest.substr(0, rest.find(" ("));  // gdb's arguments and location
  return clip(number + " " + std::string(rest.empty() ? "??" : rest));
}

}  // namespace

namespace {

constexpr size_t kMaxPlaceFrames = 64;  // frames of the main thread read to place it

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// The main thread's frames in eu-stack's (`TID <pid>:` block, else the first) or gdb's
// (`Thread 1 ` / `(LWP <pid>)` block) output, up to `limit`.
std::vector<std::string> native_main_frames(std::string_view output, pid_t pid, size_t limit) {
  const auto lines = split_lines(output);
  const std::string tid = "TID " + std::to_string(pid) + ":";
  const std::string lwp = "(LWP " + std::to_string(pid) + ")";
  auto block = pick_block(
      lines,
      [&](std::string_view l) {
        // gdb lists threads last to first; its thread 1 is the main thread even when the pid
        // does not match (another pid namespace).
        return l == tid || l.find(lwp) != std::string_view::npos || l.starts_with("Thread 1 (");
      },
      [](std::string_view l) { return l.starts_with("TID ") || l.starts_with("Thread "); });
  std::vector<std::string> frames;
  if (!block) return frames;
  for (size_t i = *block + 1; i < lines.size() && frames.size() < limit; ++i) {
    std::string_view l = trim(lines[i]);
    if (!l.starts_with("#")) break;
    frames.push_back(native_frame(l));
  }
  return frames;
}

// py-spy dump: the frames of the thread block named "MainThread", else the block of thread
// `pid`, else the first block, up to `limit`.
std::vector<std::string> python_main_frames(std::string_view pyspy_output, pid_t pid,
                                            size_t limit) {
  const auto lines = split_lines(pyspy_output);
  const std::string own = "Thread " + std::to_string(pid) + " ";
  auto block = pick_block(
      lines,
      [&](std::string_view l) {
        return l.find("\"MainThread\"") != std::string_view::npos || l.starts_with(own);
      },
      [](std::string_view l) { return l.starts_with("Thread "); });
  std::vector<std::string> frames;
  if (!block) return frames;
  size_t indent = 0;
  for (size_t i = *block + 1; i < lines.size() && frames.size() < limit; ++i) {
    std::string_view l = lines[i];
    size_t depth = l.find_first_not_of(" \t");
    if (depth == 0 || depth == std::string_view::npos) break;  // next block or blank
    if (indent == 0) indent = depth;
    if (depth != indent) continue;                   // deeper lines: locals, not frames
    if (contains(l, "(<ddprun-zygote>:")) continue;  // a warm worker's start, not the script's
    frames.push_back(clip(trim(l)));
  }
  return frames;
}

}  // namespace

std::vector<std::string> native_stack_head(std::string_view output, pid_t pid) {
  return native_main_frames(output, pid, kStackHeadLines);
}

std::vector<std::string> python_stack_head(std::string_view pyspy_output, pid_t pid) {
  return python_main_frames(pyspy_output, pid, kStackHeadLines);
}

StackPlace stack_place(std::string_view native_output, std::string_view python_output, pid_t pid) {
  StackPlace place;
  const auto python = python_main_frames(python_output, pid, kMaxPlaceFrames);
  if (!python.empty()) {
    // "all_reduce (torch/distributed/distributed_c10d.py:4174)": innermost first.
    for (const auto& f : python) {
      if (contains(f, "distributed_c10d.py:")) {
        place.where = StackPlace::Where::kInCollective;
        place.op = f.substr(0, f.find(" ("));
        place.frame = f;
        return place;
      }
    }
    place.where = StackPlace::Where::kElsewhere;
    place.frame = python.front();
    return place;
  }
  const auto native = native_main_frames(native_output, pid, kMaxPlaceFrames);
  if (native.empty()) return place;
  for (const auto& f : native) {
    if (contains(f, "c10d::") || contains(f, "gloo::") || contains(f, "nccl")) {
      place.where = StackPlace::Where::kInCollective;
      place.frame = f;
      return place;
    }
  }
  place.where = StackPlace::Where::kElsewhere;
  place.frame = native.front();
  return place;
}

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
