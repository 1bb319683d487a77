#include "agent/status_observer.hpp"

#include <algorithm>

#include "agent/health/prometheus.hpp"
#include "agent/process/kill_cause.hpp"
#include "store/sys/console.hpp"

namespace ddprun::agent {

int StatusObserver::serve(boost::asio::io_context& io, const std::string& host, int port) {
  server_ = std::make_unique<HealthServer>(io, host, port,
                                           [this](std::string_view t) { return respond(t); });
  return server_->port();
}

void StatusObserver::on_round(const RendezvousInfo& round, Millis) {
  round_ = round;
  unhealthy_reason_.clear();
}

void StatusObserver::on_attempt(const RendezvousInfo& round,
                                const std::vector<StartedWorker>& workers) {
  round_ = round;
  workers_ = workers;
  exits_.clear();
  hung_.clear();
  exit_hung_.clear();
}

void StatusObserver::on_worker_exit(const ExitedWorker& e) {
  exits_[e.local_rank] = e;
}

void StatusObserver::on_worker_replaced(const RendezvousInfo& round, const StartedWorker& worker,
                                        int) {
  round_ = round;
  exits_.erase(worker.local_rank);
  for (StartedWorker& w : workers_) {
    if (w.local_rank == worker.local_rank) w = worker;
  }
}

void StatusObserver::on_hang_found(const Hang& hang, int rank) {
  hung_.insert(hang.local_rank);
  unhealthy_reason_ = "rank " + std::to_string(rank) + " hung: " + hang.describe();
}

void StatusObserver::on_collective_judged(const CollectiveVerdict& verdict, int) {
  hang_diagnosis_ = verdict.line;
}

void StatusObserver::on_exit_hang(const StartedWorker& w, const std::string&, const StackDump&,
                                  int) {
  exit_hung_.insert(w.local_rank);
}

void StatusObserver::on_transition(WorkerState, const Decision& d, const Observed& seen,
                                   const RendezvousInfo& round) {
  round_ = round;
  if (!unhealthy_reason_.empty()) return;
  if (d.action == Action::kFail || d.action == Action::kExit) {
    unhealthy_reason_ = seen.what.empty() ? std::string(to_string(seen.event)) : seen.what;
  } else if (d.action == Action::kRestart) {
    unhealthy_reason_ = "restarting after " + std::string(to_string(seen.event));
  }
}

WorkerStatus StatusObserver::worker_status(const StartedWorker& w,
                                           std::chrono::steady_clock::time_point now) const {
  WorkerStatus ws;
  ws.local_rank = w.local_rank;
  ws.rank = w.rank;
  ws.pid = w.pid;
  auto e = exits_.find(w.local_rank);
  if (hung_.count(w.local_rank)) {
    ws.state = "hung";
  } else if (e == exits_.end()) {
    ws.state = "running";
  } else {
    ws.state =
        e->second.status.success() || exit_hung_.count(w.local_rank) ? "succeeded" : "failed";
  }
  if (e != exits_.end()) {
    ws.exit = e->second.status.describe();
    ws.exit_cause = e->second.cause;
    ws.peak_rss_bytes = e->second.peak_rss_kb * 1024;
  } else if (auto m = read_process_memory(w.pid)) {
    ws.rss_bytes = m->rss_kb * 1024;
    ws.peak_rss_bytes = m->peak_rss_kb * 1024;
  }
  if (watchdog_) {
    if (auto beat = watchdog_->last_beat(w.local_rank)) {
      ws.heartbeat_age_s = std::chrono::duration<double>(now - *beat).count();
    }
  }
  return ws;
}

void StatusObserver::judge_health(JobStatus& s) const {
  const auto running = std::count_if(s.workers.begin(), s.workers.end(),
                                     [](const WorkerStatus& w) { return w.state == "running"; });
  switch (state_) {
    case WorkerState::kInit:
      s.reason = "starting: rendezvous round " + std::to_string(round_.round) + " and the workers";
      break;
    case WorkerState::kHealthy:
      s.reason = std::to_string(running) + " of " + std::to_string(s.workers.size()) +
                 " workers running (attempt " + std::to_string(round_.restart_count) + ")";
      break;
    case WorkerState::kSucceeded:
      s.reason = "the job succeeded";
      break;
    default:
      s.healthy = false;
      s.reason = unhealthy_reason_.empty() ? "the worker group is " + s.state : unhealthy_reason_;
      break;
  }
  if (!hung_.empty()) {
    s.healthy = false;
    s.reason = unhealthy_reason_;
  }
}

JobStatus StatusObserver::snapshot() const {
  const auto now = std::chrono::steady_clock::now();
  JobStatus s;
  s.job_id = job_id_;
  s.hang_diagnosis = hang_diagnosis_;
  s.state = std::string(to_string(state_));
  s.round = round_.round;
  s.restart_count = round_.restart_count;
  s.max_restarts = round_.max_restarts;
  s.world_size = round_.world_size;
  s.group_rank = round_.group_rank;
  s.group_world_size = round_.group_world_size;
  s.members = round_.members;
  s.round_duration_s = std::chrono::duration<double>(summary_.round_took()).count();
  s.attempts = summary_.attempts();
  s.reformations = summary_.reformations();
  s.hangs = summary_.hangs();
  s.heartbeats = watchdog_ ? watchdog_->beats_received() : 0;
  s.console_dropped_lines = sys::Console::stats().dropped_lines;
  if (memory_) {
    s.memory_checkpoint_dir = memory_->path();
    s.memory_checkpoint_limit = memory_->limit();
    s.memory_checkpoint_bytes = memory_->used_bytes();
  }
  s.uptime_s = summary_.uptime_s();
  if (state_ != WorkerState::kInit) {
    for (const StartedWorker& w : workers_) s.workers.push_back(worker_status(w, now));
  }
  judge_health(s);
  return s;
}

HttpResponse StatusObserver::respond(std::string_view target) const {
  if (target == "/healthz" || target == "/health") {
    JobStatus s = snapshot();
    return {healthz_code(s), "text/plain; charset=utf-8", healthz_body(s)};
  }
  if (target == "/metrics") {
    return {200, kPrometheusContentType, render_metrics(snapshot())};
  }
  if (target == "/status") {
    return {200, "application/json", render_status_json(snapshot())};
  }
  return {404, "text/plain; charset=utf-8", "not found: try /healthz, /metrics or /status\n"};
}

}  // namespace ddprun::agent
