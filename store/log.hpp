// One-line, attributable log messages on stderr: "<prefix> host:pid: message".
#pragma once

#include <string_view>

namespace ddprun::store {

// Writes the whole line with one write(2), so lines from several threads or processes
// sharing stderr do not interleave. Thread-safe.
void log_line(std::string_view prefix, std::string_view message);

}  // namespace ddprun::store
