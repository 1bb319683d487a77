#include "agent/job_summary.hpp"

#include <cstdio>
#include <string>

#include "store/sys/log.hpp"

namespace ddprun::agent {
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
                ", wall time " + wall + " s");
}

}  // namespace ddprun::agent
