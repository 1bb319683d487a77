#include "agent/process/stack_dump.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
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
#include "store/sys/path_search.hpp"

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

// Starts a tool (argv[0] a path) the way the agent starts workers (child_process.hpp): its own
// session, killed with the agent, stdin on /dev/null, stdout and stderr on `out_fd`, no other
// descriptor, every signal at its default. Throws std::system_error when it cannot.
ChildProcess start_tool(std::vector<std::string> argv, int out_fd) {
  static const std::vector<int> every_signal = [] {
    std::vector<int> all;
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) all.push_back(sig);
    }
    return all;
  }();
  sys::UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  std::vector<char*> args = c_array(argv);
  SpawnRequest req;
  req.path = args[0];
  req.argv = args.data();
  req.envp = environ;
  req.stdin_fd = null.get();
  req.stdout_fd = out_fd;
  req.stderr_fd = out_fd;
  req.reset_signals = every_signal;
  return ChildProcess::spawn(req);
}

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

// A tool ddprun runs on its own: never from the directory the job was started in.
std::optional<std::string> find_tool(const std::string& name, std::string_view search_path) {
  return sys::find_on_path(name, search_path, sys::EmptyEntry::kSkipped);
}

std::optional<Tool> native_tool(pid_t pid, std::string_view search_path) {
  const std::string p = std::to_string(pid);
  if (auto eu = find_tool("eu-stack", search_path)) {
    return Tool{"eu-stack", {*eu, "-p", p}, "eu-stack -p " + p + " (native, every thread)"};
  }
  if (auto gdb = find_tool("gdb", search_path)) {
    return Tool{"gdb",
                {*gdb, "-batch", "-nx", "-p", p, "-ex", "thread apply all bt"},
                "gdb -batch -nx -p " + p + " -ex 'thread apply all bt' (native, every thread)"};
  }
  return std::nullopt;
}

std::optional<Tool> python_tool(pid_t pid, std::string_view search_path) {
  const std::string p = std::to_string(pid);
  if (auto spy = find_tool("py-spy", search_path)) {
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
  std::optional<ChildProcess> proc;
  try {
    proc.emplace(start_tool(tool.argv, file));
  } catch (const std::system_error& e) {
    std::string note = "cannot run " + tool.argv[0] + ": " + e.what();
    append(file, "=== " + note + " ===\n");
    notes.push_back(std::move(note));
    co_return run;
  }
  asio::posix::stream_descriptor exited(ex, proc->take_pidfd().release());
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
    proc->signal_group(SIGKILL);
    while (!ChildProcess::has_exited(exited.native_handle())) {
      auto [ec] = co_await exited.async_wait(asio::posix::stream_descriptor::wait_read, kUseTuple);
      if (ec) break;
    }
  }
  const ExitStatus status = proc->reap();
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
