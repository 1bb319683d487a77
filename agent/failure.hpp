// ProcessFailure and the failure summary (after torchelastic's ProcessFailure and
// ChildFailedError): what one failed worker left behind, and the report ddprun prints when the
// job fails, in torchrun's format.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent {

// What PyTorch's @record (or the C++ SDK) wrote to TORCHELASTIC_ERROR_FILE:
//   {"message": {"message": "<Type>: <text>", "extraInfo": {"py_callstack": "...",
//    "timestamp": "<unix seconds>"}}}   or   {"message": "<text>", "timestamp": <seconds>}
struct ErrorFileData {
  std::string message;    // one line: "ValueError: boom"
  std::string traceback;  // py_callstack if present, else the message
  std::optional<int64_t> timestamp;
};

// Reads and parses the error file. nullopt if the file does not exist; a file that exists
// but cannot be parsed gives a message saying so (never throws).
std::optional<ErrorFileData> read_error_file(const std::string& path);

struct ProcessFailure {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = 0;
  int exitcode = 0;        // torchrun's convention: exit status, or -signal
  std::string error_file;  // "<N/A>" when the worker wrote none
  int64_t timestamp = 0;   // unix seconds: from the error file, else when ddprun saw the exit
  uint64_t sequence = 0;   // order in which ddprun observed the exits (breaks ties)
  std::string message;     // one line for the log
  std::string traceback;   // the summary's "traceback" field
};

// Builds the failure of one worker from its exit code and error file.
ProcessFailure make_failure(int local_rank, int global_rank, pid_t pid, int exitcode,
                            const std::string& error_file_path, int64_t observed_at,
                            uint64_t sequence);

// The root cause: the earliest failure by timestamp (seconds, as torchrun), then by the order
// ddprun observed them. `failures` must not be empty.
const ProcessFailure& root_cause(const std::vector<ProcessFailure>& failures);

// The process exit code ddprun reports for a failure: the worker's exit status, or 128 + the
// signal number if a signal killed it (as a shell would report it).
int exit_code_for(const ProcessFailure& failure);

// "SIGKILL" for 9, "SIGNAL 77" for unknown numbers.
std::string signal_name(int signo);
// 15 for "SIGTERM" (also accepts "TERM" and numbers); nullopt if unknown.
std::optional<int> signal_number(std::string_view name);

// The summary, in torchrun's layout (see ../shared/docs/torchrun-contract.md, section 5).
std::string format_failure_summary(std::string_view title,
                                   const std::vector<ProcessFailure>& failures,
                                   std::string_view host);

}  // namespace ddprun::agent
