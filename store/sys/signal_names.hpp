// Signal names as users write them, for every program of ddprun (the agent's exit reports,
// the launcher's --signal flags and its fan-out's messages, the guardian's log line).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ddprun::sys {

// "SIGKILL" for 9, "SIGNAL 77" for unknown numbers.
std::string signal_name(int signo);
// 15 for "SIGTERM" (also accepts "TERM" and numbers); nullopt if unknown.
std::optional<int> signal_number(std::string_view name);

}  // namespace ddprun::sys
