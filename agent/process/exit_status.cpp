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

std::string signal_name(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  if (abbrev) return std::string("SIG") + abbrev;
  return "SIGNAL " + std::to_string(signo);
}

std::optional<int> signal_number(std::string_view name) {
  int n = 0;
  auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), n);
  if (ec == std::errc() && p == name.data() + name.size()) {
    if (n > 0 && n < NSIG) return n;
    return std::nullopt;
  }
  if (name.starts_with("SIG")) name.remove_prefix(3);
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* abbrev = ::sigabbrev_np(sig);
    if (abbrev && name == abbrev) return sig;
  }
  return std::nullopt;
}

}  // namespace ddprun::agent
