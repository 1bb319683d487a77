#include "agent/job_summary.hpp"

#include <cstdio>
#include <string>

#include "agent/process/stream_pump.hpp"
#include "store/sys/log.hpp"

namespace ddprun::agent {
namespace {

// "; 2 log files incomplete: /x/stdout.log (No space left on device), ..." or "".
std::string incomplete_logs() {
  const auto& files = StreamPump::incomplete_files();
  if (files.empty()) return {};
  std::string out = "; " + std::to_string(files.size()) + " log file" +
                    (files.size() == 1 ? "" : "s") + " incomplete: ";
  for (size_t i = 0; i < files.size() && i < 3; ++i) out += (i ? ", " : "") + files[i];
  if (files.size() > 3) out += ", ...";
  return out;
}

}  // namespace
namespace {

std::string plural(uint64_t n, const char* word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

}  // namespace

void JobSummary::on_job_end(const JobResult&, const RendezvousInfo& round) {
  round_ = round;
  char wall[32];
  std::snprintf(wall, sizeof wall, "%.1f", uptime_s());
  sys::log_line("job summary: " + plural(attempts_, "attempt") + ", " +
                plural(static_cast<uint64_t>(restarts()), "restart") + ", " +
                plural(reformations_, "re-formation") + ", " + plural(hangs_, "hang") +
                ", wall time " + wall + " s" + incomplete_logs());
}

}  // namespace ddprun::agent
