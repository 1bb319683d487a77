// PrometheusText: builds a page in the Prometheus text exposition format 0.0.4 (what /metrics
// serves, with kPrometheusContentType):
//
//   # HELP ddprun_restarts_total Worker group restarts since the agent started.
//   # TYPE ddprun_restarts_total counter
//   ddprun_restarts_total 2
//   # HELP ddprun_workers Workers by state.
//   # TYPE ddprun_workers gauge
//   ddprun_workers{state="running"} 7
//   ddprun_workers{state="failed"} 1
//
// Each family is declared once (HELP and TYPE lines) and its samples follow it directly, as the
// format requires. Mistakes in metric definitions are bugs of ours, not input: they throw
// std::logic_error (a bad name, a type other than counter/gauge, a counter whose name does not
// end in "_total", a family declared twice, a sample that is not of the latest family).
// Label values and HELP text are escaped; values are written without locale ("0.5", "3",
// "NaN", "+Inf", "-Inf"). Not thread-safe; build one per page.
#pragma once

#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ddprun::agent {

inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

class PrometheusText {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;

  // Declares a metric family: `type` is "counter" or "gauge"; counter names end in "_total".
  void family(std::string_view name, std::string_view type, std::string_view help);
  // One sample of the most recently declared family, which must be named `name`.
  void sample(std::string_view name, double value, const Labels& labels = {});
  // The page so far.
  std::string str() const { return out_; }

 private:
  std::string out_;
  std::string current_;                       // the family samples may follow now
  std::unordered_set<std::string> declared_;  // every family so far
};

// Exposed for tests: the value as the format spells it.
std::string prometheus_value(double value);

}  // namespace ddprun::agent
