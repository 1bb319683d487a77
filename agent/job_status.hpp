// JobStatus: what the agent knows about the job on this node at one instant, and its three
// renderings for the health endpoints (--health-port): /healthz (a status code and one line),
// /metrics (Prometheus text) and /status (JSON). The agent builds a snapshot per request on
// its own thread; nothing here touches the agent.
//
// Metric names (all prefixed ddprun_; counters end in _total):
//   restarts_total, reformations_total, hangs_total, heartbeats_total,
//   console_dropped_lines_total                                          counters
//   max_restarts, world_size, group_world_size, rendezvous_round,
//   rendezvous_duration_seconds, uptime_seconds, healthy,
//   workers{state="running|succeeded|failed|hung"},
//   heartbeat_age_seconds{local_rank,rank}  (ranks that have beaten this attempt),
//   worker_rss_bytes{local_rank,rank}, worker_peak_rss_bytes{local_rank,rank}  gauges
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::agent {

struct WorkerStatus {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = 0;
  std::string state;                      // running | succeeded | failed | hung
  std::string exit;                       // "exit code 1", "SIGKILL"; empty while running
  std::string exit_cause;                 // who sent a SIGKILL (agent/process/kill_cause.hpp)
  uint64_t rss_bytes = 0;                 // now (running workers; 0: unknown)
  uint64_t peak_rss_bytes = 0;            // its peak so far, or at its exit (0: unknown)
  std::optional<double> heartbeat_age_s;  // since the last beat; none: never beat
};

struct JobStatus {
  std::string job_id;
  std::string state;  // the worker group's state: INIT, HEALTHY, UNHEALTHY, ...
  bool healthy = true;
  std::string reason;          // one line: why (un)healthy
  std::string hang_diagnosis;  // the last collective hang's judgement (empty: none)
  int round = 0;
  int restart_count = 0;
  int max_restarts = 0;
  int world_size = 0;
  int group_rank = 0;
  int group_world_size = 0;
  std::vector<std::string> members;  // the current round's nodes, by node rank
  double round_duration_s = 0;       // how long the last rendezvous took
  uint64_t attempts = 0;             // worker groups started
  uint64_t reformations = 0;
  uint64_t hangs = 0;
  uint64_t heartbeats = 0;
  uint64_t console_dropped_lines = 0;  // worker lines not shown: nobody read the console
  std::string memory_checkpoint_dir;   // empty: no in-memory checkpoints
  uint64_t memory_checkpoint_limit = 0;
  uint64_t memory_checkpoint_bytes = 0;  // in use now
  double uptime_s = 0;
  std::vector<WorkerStatus> workers;
};

// /healthz: 200 "ok: <reason>" or 503 "unhealthy: <reason>".
int healthz_code(const JobStatus& s);
std::string healthz_body(const JobStatus& s);

std::string render_metrics(const JobStatus& s);      // Prometheus text format 0.0.4
std::string render_status_json(const JobStatus& s);  // one JSON object

}  // namespace ddprun::agent
