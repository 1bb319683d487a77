#include "store/sys/signal_names.hpp"

#include <charconv>
#include <csignal>
#include <cstring>

namespace ddprun::sys {

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

}  // namespace ddprun::sys
