// The agent's own diagnostics: one line per event on stderr, attributable as
// "[ddprun] host:pid message" (see ../STYLE rules: one line per event, with the values that
// matter). Lines are written with a single write(2), so they never interleave mid-line with
// workers writing to the same terminal.
#pragma once

#include <string>
#include <string_view>

namespace ddprun::agent {

// "[ddprun] host:pid" — computed on first use (gethostname + getpid).
const std::string& log_prefix();

// The short host name (gethostname), cached.
const std::string& host_name();

// Writes "[ddprun] host:pid <message>\n" to stderr.
void log_line(std::string_view message);

// Quiet mode for tests of the agent as a library: log_line becomes a no-op.
void set_log_quiet(bool quiet);

}  // namespace ddprun::agent
