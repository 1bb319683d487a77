// The one log format of every ddprun program: one line per event on stderr,
//   "<tag> host:pid message"      e.g. "[ddprun] node3:4121 attempt 0: started 8 worker(s)"
// written with a single write(2), so lines never interleave mid-line with workers or threads
// writing to the same terminal; through Console (console.hpp), so a stderr nobody reads never
// blocks the caller once the program attached its io_context. Thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace ddprun::sys {

// The short host name (gethostname), cached; "localhost" if it cannot be read.
const std::string& host_name();

// Writes "<tag> host:pid <message>\n" to stderr. The tag names the component: "[ddprun]",
// "[ddpstore]", "[ddprun store]"...
void log_line(std::string_view tag, std::string_view message);

// The agent's and launcher's lines: tag "[ddprun]".
inline void log_line(std::string_view message) {
  log_line("[ddprun]", message);
}

}  // namespace ddprun::sys
