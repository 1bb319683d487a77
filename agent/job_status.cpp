#include "agent/job_status.hpp"

#include <nlohmann/json.hpp>

#include "agent/health/prometheus.hpp"

namespace ddprun::agent {

int healthz_code(const JobStatus& s) {
  return s.healthy ? 200 : 503;
}

std::string healthz_body(const JobStatus& s) {
  return std::string(s.healthy ? "ok: " : "unhealthy: ") + s.reason + "\n";
}

namespace {

void gauge(PrometheusText& t, const char* name, const char* help, double value) {
  t.family(name, "gauge", help);
  t.sample(name, value);
}

void counter(PrometheusText& t, const char* name, const char* help, double value) {
  t.family(name, "counter", help);
  t.sample(name, value);
}

// The job's and this node's counters and gauges.
void job_metrics(PrometheusText& t, const JobStatus& s) {
  counter(t, "ddprun_restarts_total", "Restarts of the worker group spent from the job's budget",
          s.restart_count);
  counter(t, "ddprun_reformations_total",
          "Rendezvous rounds re-formed after a membership change (no restart spent)",
          static_cast<double>(s.reformations));
  counter(t, "ddprun_hangs_total", "Workers of this node found hung", static_cast<double>(s.hangs));
  counter(t, "ddprun_heartbeats_total", "Heartbeats received from this node's workers",
          static_cast<double>(s.heartbeats));
  counter(t, "ddprun_console_dropped_lines_total",
          "Worker output lines not shown on ddprun's console because it was not being read "
          "(the log files have them)",
          static_cast<double>(s.console_dropped_lines));
  counter(t, "ddprun_attempts_total", "Worker groups started on this node",
          static_cast<double>(s.attempts));
  gauge(t, "ddprun_max_restarts", "The job's restart budget", s.max_restarts);
  gauge(t, "ddprun_world_size", "Workers in the whole job (WORLD_SIZE)", s.world_size);
  gauge(t, "ddprun_group_world_size", "Nodes in the current round", s.group_world_size);
  gauge(t, "ddprun_rendezvous_round", "The current rendezvous round", s.round);
  gauge(t, "ddprun_rendezvous_duration_seconds", "How long the last rendezvous took",
        s.round_duration_s);
  gauge(t, "ddprun_uptime_seconds", "Seconds since the agent started", s.uptime_s);
  if (!s.memory_checkpoint_dir.empty()) {
    gauge(t, "ddprun_memory_checkpoint_bytes",
          "Bytes the job's in-memory checkpoints hold on this node",
          static_cast<double>(s.memory_checkpoint_bytes));
    gauge(t, "ddprun_memory_checkpoint_limit_bytes", "Their bound (--memory-checkpoints)",
          static_cast<double>(s.memory_checkpoint_limit));
  }
  gauge(t, "ddprun_healthy", "1 while the worker group runs or starts, 0 when it failed or hangs",
        s.healthy ? 1 : 0);
}

// One gauge family with a sample per worker that has `value` (labels: local_rank, rank).
template <typename Value>
void per_worker(PrometheusText& t, const char* name, const char* help, const JobStatus& s,
                Value value) {
  t.family(name, "gauge", help);
  for (const auto& w : s.workers) {
    std::optional<double> v = value(w);
    if (!v) continue;
    t.sample(name, *v,
             {{"local_rank", std::to_string(w.local_rank)}, {"rank", std::to_string(w.rank)}});
  }
}

void worker_metrics(PrometheusText& t, const JobStatus& s) {
  t.family("ddprun_workers", "gauge", "This node's workers of the current attempt, by state");
  for (const char* state : {"running", "succeeded", "failed", "hung"}) {
    int n = 0;
    for (const auto& w : s.workers) n += w.state == state ? 1 : 0;
    t.sample("ddprun_workers", n, {{"state", state}});
  }
  // Byte counts of 0 are unknown: no sample.
  auto bytes = [](uint64_t b) {
    return b ? std::optional<double>(static_cast<double>(b)) : std::nullopt;
  };
  per_worker(t, "ddprun_heartbeat_age_seconds",
             "Seconds since each worker's last heartbeat (workers that have beaten this attempt)",
             s, [](const WorkerStatus& w) { return w.heartbeat_age_s; });
  per_worker(t, "ddprun_worker_rss_bytes", "Each running worker's resident set now", s,
             [&](const WorkerStatus& w) { return bytes(w.rss_bytes); });
  per_worker(t, "ddprun_worker_peak_rss_bytes",
             "Each worker's peak resident set (of this attempt; at its exit once it exited)", s,
             [&](const WorkerStatus& w) { return bytes(w.peak_rss_bytes); });
}

}  // namespace

std::string render_metrics(const JobStatus& s) {
  PrometheusText t;
  job_metrics(t, s);
  worker_metrics(t, s);
  return t.str();
}

std::string render_status_json(const JobStatus& s) {
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& w : s.workers) {
    nlohmann::json j = {
        {"local_rank", w.local_rank}, {"rank", w.rank}, {"pid", w.pid}, {"state", w.state}};
    if (!w.exit.empty()) j["exit"] = w.exit;
    if (!w.exit_cause.empty()) j["exit_cause"] = w.exit_cause;
    if (w.rss_bytes) j["rss_bytes"] = w.rss_bytes;
    if (w.peak_rss_bytes) j["peak_rss_bytes"] = w.peak_rss_bytes;
    j["heartbeat_age_s"] = w.heartbeat_age_s ? nlohmann::json(*w.heartbeat_age_s) : nullptr;
    workers.push_back(std::move(j));
  }
  nlohmann::json j = {
      {"job", s.job_id},
      {"state", s.state},
      {"healthy", s.healthy},
      {"reason", s.reason},
      {"hang_diagnosis", s.hang_diagnosis},
      {"round", s.round},
      {"restart_count", s.restart_count},
      {"max_restarts", s.max_restarts},
      {"world_size", s.world_size},
      {"group_rank", s.group_rank},
      {"group_world_size", s.group_world_size},
      {"members", s.members},
      {"rendezvous_duration_s", s.round_duration_s},
      {"attempts", s.attempts},
      {"reformations", s.reformations},
      {"hangs", s.hangs},
      {"heartbeats", s.heartbeats},
      {"console_dropped_lines", s.console_dropped_lines},
      {"uptime_s", s.uptime_s},
      {"workers", std::move(workers)},
  };
  if (!s.memory_checkpoint_dir.empty()) {
    j["memory_checkpoints"] = {{"dir", s.memory_checkpoint_dir},
                               {"bytes", s.memory_checkpoint_bytes},
                               {"limit", s.memory_checkpoint_limit}};
  }
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace ddprun::agent
