#include "agent/process/exit_status.hpp"

#include <signal.h>

#include <charconv>
#include <cstring>

namespace ddprun::agent {

int ExitStatus::torchrun_code() const {
  switch (kind) {
    case Kind::kExited:
      return value;
    case Kind::kSignaled:
      return -value;
    case Kind::kExecFailed:
      return 127;
  }
  return 1;
}

int ExitStatus::shell_code() const {
  return kind == Kind::kSignaled ? 128 + value : torchrun_code();
}

std::string ExitStatus::describe() const {
  switch (kind) {
    case Kind::kExited:
      return "exited with " + std::to_string(value);
    case Kind::kSignaled:
      return "was killed by " + signal_name(value);
    case Kind::kExecFailed:
      return std::string("could not be executed (") + std::strerror(value) + ")";
  }
  return "ended";
}

}  // namespace ddprun::agent
