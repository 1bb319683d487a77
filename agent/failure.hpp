// ProcessFailure and the failure summary (after torchelastic's ProcessFailure and
// ChildFailedError): what one failed worker left behind, and the report ddprun prints when the
// job fails, in torchrun's format.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agent/process/exit_status.hpp"
#include "agent/process/process_context.hpp"
#include "agent/worker_group.hpp"

namespace ddprun::agent {

// What PyTorch's @record (or the C++ SDK) wrote to TORCHELASTIC_ERROR_FILE:
//   {"message": {"message": "<Type>: <text>", "extraInfo": {"py_callstack": "...",
//    "timestamp": "<unix seconds>"}}}   or   {"message": "<text>", "timestamp": <seconds>}
struct ErrorFileData {
  std::string message;    // one line: "ValueError: boom"
  std::string traceback;  // py_callstack if present, else the message
  std::optional<int64_t> timestamp;
};

// "SIGSEGV, segmentation fault" for the signals a crash in native code raises (SIGSEGV, SIGBUS,
// SIGABRT, SIGFPE, SIGILL); "" for the others.
std::string fatal_signal_text(int signo);

// The last `max_lines` non-empty lines of a log file (from its last 16 KiB; each cut to 200
// characters), oldest first. Empty when it cannot be read.
std::vector<std::string> last_lines(const std::string& path, size_t max_lines = 10);

// Reads and parses the error file. nullopt if the file does not exist; a file that exists
// but cannot be parsed gives a message saying so (never throws).
std::optional<ErrorFileData> read_error_file(const std::string& path);

struct ProcessFailure {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = 0;
  ExitStatus status;
  std::string error_file;  // "<N/A>" when the worker wrote none
  int64_t timestamp = 0;   // unix seconds: from the error file, else when ddprun saw the exit
  uint64_t sequence = 0;   // order in which ddprun observed the exits (breaks ties)
  std::string message;     // one line for the log
  std::string traceback;   // the summary's "traceback" field
  std::string cause;       // who sent a SIGKILL (kill_cause.hpp), or what a fatal signal means
                           // ("SIGSEGV, segmentation fault")
  std::vector<std::string> stderr_tail;  // its stderr's last lines (no error file; in a file)
  uint64_t peak_rss_kb = 0;              // 0: unknown
  // A worker the agent found hung (agent/hang/): why, and where its stacks are.
  std::string hang;                     // "no heartbeat for 60 s"; empty: not a hang
  std::string stacks_path;              // the stack dump in the attempt's log directory
  std::vector<std::string> stack_head;  // its first frames, for the summary
  std::string collective;  // the hang's collective judgement (agent/hang/collective_judge.hpp)
};

// Builds the failure of one worker from its exit code and error file.
ProcessFailure make_failure(int local_rank, int global_rank, pid_t pid, ExitStatus status,
                            const std::string& error_file_path, int64_t observed_at,
                            uint64_t sequence);

// The root cause: the earliest failure by timestamp (seconds, as torchrun), then by the order
// ddprun observed them. `failures` must not be empty.
const ProcessFailure& root_cause(const std::vector<ProcessFailure>& failures);

// The summary, in torchrun's layout (docs/logs-and-failures.md).
std::string format_failure_summary(std::string_view title,
                                   const std::vector<ProcessFailure>& failures,
                                   std::string_view host);

// For an outer launcher or scheduler that set TORCHELASTIC_ERROR_FILE for ddprun itself: the
// root cause's error file, copied to `path` with "errorCode" set to its exit code (as torchrun
// does), or, where the worker wrote none, one in the same format made from the failure (its
// message and cause, the traceback field; torchrun writes nothing then). Returns "" or why it
// could not write.
std::string write_launcher_error_file(const std::vector<ProcessFailure>& failures,
                                      const std::string& path);

// The failures of the attempt's workers that exited non-zero and are not in `reported` yet
// (only those that wrote an error file, with `only_with_error_file`: workers that died of the
// agent's own stop signal are no failures of their own). Logs one line each, adds them to
// `reported`.
std::vector<ProcessFailure> collect_new_failures(const WorkerGroup& group,
                                                 const ProcessContext& pctx,
                                                 std::set<int>& reported,
                                                 bool only_with_error_file);

}  // namespace ddprun::agent
