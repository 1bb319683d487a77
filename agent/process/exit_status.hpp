// ExitStatus: how one process ended, as the kernel told it, with no sentinel values: it exited
// with a code, a signal killed it, or it never ran because execve failed. Conversions to the
// conventions people read (torchrun's signed exit code, a shell's 128 + signal) happen only
// when a status is printed or becomes ddprun's own exit code.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "store/sys/signal_names.hpp"

namespace ddprun::agent {

struct ExitStatus {
  enum class Kind {
    kExited,      // value = the exit code (0-255)
    kSignaled,    // value = the signal number
    kExecFailed,  // value = errno of the failed execve
  };
  Kind kind = Kind::kExited;
  int value = 0;

  static ExitStatus exited(int code) { return {Kind::kExited, code}; }
  static ExitStatus signaled(int signo) { return {Kind::kSignaled, signo}; }
  static ExitStatus exec_failed(int error) { return {Kind::kExecFailed, error}; }

  bool success() const { return kind == Kind::kExited && value == 0; }
  // torchrun's "exitcode" field: the exit code, or minus the signal (exec failure: 127, as a
  // shell reports a command it cannot run).
  int torchrun_code() const;
  // As a shell reports it: the exit code, 128 + signal, 127 for an exec failure.
  int shell_code() const;
  // For a log line: "exited with 3", "was killed by SIGKILL", "could not be executed (No such
  // file or directory)".
  std::string describe() const;

  bool operator==(const ExitStatus&) const = default;
};

using sys::signal_name;  // the agent's messages name signals as the rest of ddprun does
using sys::signal_number;

}  // namespace ddprun::agent
