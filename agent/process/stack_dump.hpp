// Stack dumps of a hung worker, taken before the agent stops it.
//
// dump_stacks() runs external tools, one after the other (two ptracers at once fail):
//   1. native stacks of every thread: `eu-stack -p PID` (elfutils) or, when it is absent,
//      `gdb -batch -nx -p PID -ex "thread apply all bt"`;
//   2. Python stacks: `py-spy dump --pid PID --nonblocking` (reads memory, never pauses).
// Each tool runs in its own session and process group with stdin on /dev/null and its stdout
// and stderr appended straight to the dump file under a header line
// (`=== eu-stack -p 1234 (native, every thread) ===`). The agent waits for each through a
// pidfd (no SIGCHLD, no polling); at `timeout` the tool's whole process group is SIGKILLed
// and reaped, and a note says so.
//
// The worker is left as it was found: eu-stack and gdb re-stop a worker that was stopped
// (state T) and resume one that was not; if a killed tool left a running worker stopped, the
// agent sends it SIGCONT. py-spy --nonblocking does not stop it at all.
//
// Permissions: the tools need ptrace access to the worker (PTRACE_MODE_ATTACH, also for
// py-spy's process_vm_readv). Under Yama ptrace_scope=1 only ancestors may attach, and a tool
// is the agent's child, not the worker's ancestor: every worker therefore declares the agent
// as its ptracer (PR_SET_PTRACER, child_process.cpp), which Yama extends to the agent's
// descendants. ptrace_scope=2/3, or a container whose seccomp profile refuses ptrace and
// process_vm_readv and that lacks CAP_SYS_PTRACE, makes the tools fail: the file and notes then
// hold their error messages.
//
// Threads: co_await on `ex`'s thread (the agent's io_context). `pid` is a worker the agent has
// not reaped (so the pid cannot be reused); one that exits during the dump is noted. A dump
// takes at most about 2 x timeout (native tool, then py-spy): eu-stack and py-spy take 0.01-0.5 s
// on a torch worker, gdb 3-40 s (it reads the symbols of every shared library; eu-stack only of
// the frames it prints). Destroying the coroutine mid-dump SIGKILLs and reaps the running tool.
#pragma once

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent {

// Where a worker's main thread was when its stacks were taken, for the collective judgement
// (agent/hang/collective_judge.hpp): inside a collective of torch's c10d (its Python frames in
// distributed_c10d.py, or native c10d::/gloo::/NCCL frames), or elsewhere.
struct StackPlace {
  enum class Where { kUnknown, kInCollective, kElsewhere };
  Where where = Where::kUnknown;
  std::string op;     // kInCollective from Python frames: the c10d function ("all_reduce")
  std::string frame;  // the frame that shows it; kElsewhere: the innermost one
};

struct StackDump {
  std::string path;  // the file written (always created; if no tool could run, it says why)
  // Up to kStackHeadLines innermost frames of the main thread, innermost first, for the console
  // summary: py-spy's lines ("stuck_in_python (train.py:12)") when it printed any, else the
  // native frames of the main thread ("#0 __futex_abstimed_wait_common", addresses trimmed).
  // May be empty (no tool, an unknown output format).
  std::vector<std::string> head;
  // One line per thing that went wrong or is missing, e.g. "eu-stack timed out after 10 s",
  // "py-spy not installed: no Python stacks (pip install py-spy)".
  std::vector<std::string> notes;
  std::chrono::milliseconds took{0};
  StackPlace place;
};

inline constexpr size_t kStackHeadLines = 6;

struct StackDumpOptions {
  std::chrono::milliseconds timeout = std::chrono::seconds(10);  // per tool
  // Where the tools are looked for, as a PATH value; unset: the agent's PATH.
  std::optional<std::string> search_path;
};

// Writes the native then the Python stacks of `pid` into `path` (created or truncated). Never
// throws for a tool's failure (missing, refused, crashed, timed out: see `notes`); throws
// std::system_error only if `path` cannot be created.
boost::asio::awaitable<StackDump> dump_stacks(
    boost::asio::any_io_executor ex, pid_t pid, std::string path,
    std::chrono::milliseconds timeout = std::chrono::seconds(10));
boost::asio::awaitable<StackDump> dump_stacks(boost::asio::any_io_executor ex, pid_t pid,
                                              std::string path, StackDumpOptions options);

// The parsers behind StackDump::head, exposed for tests. They never throw on odd input; an
// unknown format gives an empty result.
//
// py-spy dump: the frames of the thread block named "MainThread", else the block of thread
// `pid`, else the first block.
std::vector<std::string> python_stack_head(std::string_view pyspy_output, pid_t pid);
// eu-stack (`TID <pid>:` block, else the first) or gdb (`Thread 1 ` / `(LWP <pid>)` block).
std::vector<std::string> native_stack_head(std::string_view output, pid_t pid);
// From both tools' outputs (either may be empty): Python frames decide when there are any.
StackPlace stack_place(std::string_view native_output, std::string_view python_output, pid_t pid);

}  // namespace ddprun::agent
