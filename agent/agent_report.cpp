// What a person (or a program) sees of the agent besides its log lines: the health
// endpoints' snapshot, the event log's transitions and rounds, and the job's summary line.
#include <unistd.h>

#include "agent/agent_impl.hpp"
#include "agent/health/prometheus.hpp"
#include "store/sys/console.hpp"
#include "store/sys/log.hpp"

namespace ddprun::agent {

namespace {

std::string plural(uint64_t n, const char* word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

const char* result_name(JobResult::Kind kind) {
  using K = JobResult::Kind;
  switch (kind) {
    case K::kSucceeded:
      return "succeeded";
    case K::kWorkersFailed:
      return "workers_failed";
    case K::kWorkerHung:
      return "worker_hung";
    case K::kSignaled:
      return "signaled";
    case K::kRendezvousFailed:
      return "rendezvous_failed";
    case K::kStoreLost:
      return "store_lost";
    case K::kStartFailed:
      return "start_failed";
  }
  return "?";
}

}  // namespace

JobStatus Agent::Impl::snapshot() const {
  const RendezvousInfo& r = group_.round();
  const auto now = Clock::now();
  JobStatus s;
  s.job_id = group_.run_id();
  s.state = std::string(to_string(group_.state()));
  s.round = r.round;
  s.restart_count = r.restart_count;
  s.max_restarts = r.max_restarts;
  s.world_size = r.world_size;
  s.group_rank = r.group_rank;
  s.group_world_size = r.group_world_size;
  s.members = r.members;
  s.round_duration_s = seconds(round_took_);
  s.attempts = attempts_;
  s.reformations = reformations_;
  s.hangs = hangs_;
  s.heartbeats = watchdog_ ? watchdog_->beats_received() : 0;
  s.console_dropped_lines = sys::Console::stats().dropped_lines;
  s.uptime_s = seconds(now - agent_started_);

  size_t running = 0;
  std::set<int> hung;
  for (const auto& h : hung_) hung.insert(h.hang.local_rank);
  for (const auto& h : pending_hangs_) hung.insert(h.local_rank);
  if (pctx_ && group_.state() != WorkerState::kInit) {
    for (const Worker& w : group_.workers()) {
      WorkerStatus ws;
      ws.local_rank = w.local_rank;
      ws.rank = w.global_rank;
      ws.pid = pctx_->pid_of(w.local_rank);
      const auto& e = pctx_->exit_of(w.local_rank);
      if (hung.count(w.local_rank)) {
        ws.state = "hung";
      } else if (!e) {
        ws.state = "running";
        ++running;
      } else {
        ws.state = e->status.success() || exit_hung_.count(w.local_rank) ? "succeeded" : "failed";
      }
      if (e) ws.exit = e->status.describe();
      if (watchdog_) {
        if (auto beat = watchdog_->last_beat(w.local_rank))
          ws.heartbeat_age_s = seconds(now - *beat);
      }
      s.workers.push_back(std::move(ws));
    }
  }

  switch (group_.state()) {
    case WorkerState::kInit:
      s.reason = "starting: rendezvous round " + std::to_string(r.round) + " and the workers";
      break;
    case WorkerState::kHealthy:
      s.reason = std::to_string(running) + " of " + std::to_string(s.workers.size()) +
                 " workers running (attempt " + std::to_string(r.restart_count) + ")";
      break;
    case WorkerState::kSucceeded:
      s.reason = "the job succeeded";
      break;
    default:
      s.healthy = false;
      s.reason = unhealthy_reason_.empty() ? "the worker group is " + s.state : unhealthy_reason_;
      break;
  }
  if (!hung.empty()) {
    s.healthy = false;
    s.reason = unhealthy_reason_;
  }
  return s;
}

HttpResponse Agent::Impl::serve(std::string_view target) const {
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

void Agent::Impl::emit_transition(const Decision& d, const Observed& seen) {
  // The first cause noted in a round stays its reason: a hang's description, set when the hang
  // was noticed, outlives the transition that follows it and the stop that comes after.
  if (unhealthy_reason_.empty()) {
    if (d.action == Action::kFail || d.action == Action::kExit) {
      unhealthy_reason_ = seen.what.empty() ? std::string(to_string(seen.event)) : seen.what;
    } else if (d.action == Action::kRestart) {
      unhealthy_reason_ = "restarting after " + std::string(to_string(seen.event));
    }
  }
  if (!events_.enabled()) return;
  const RendezvousInfo& r = group_.round();
  nlohmann::json fields = {{"from", to_string(group_.state())},
                           {"to", to_string(d.next)},
                           {"on", to_string(seen.event)},
                           {"action", to_string(d.action)},
                           {"round", r.round},
                           {"restart_count", r.restart_count},
                           {"max_restarts", r.max_restarts},
                           {"world_size", r.world_size}};
  if (!seen.what.empty()) fields["reason"] = seen.what;
  events_.emit("transition", std::move(fields));
}

void Agent::Impl::emit_round(std::chrono::milliseconds took) {
  round_took_ = took;
  unhealthy_reason_.clear();
  const RendezvousInfo& r = group_.round();
  events_.emit("round", {{"round", r.round},
                         {"group_rank", r.group_rank},
                         {"group_world_size", r.group_world_size},
                         {"world_size", r.world_size},
                         {"restart_count", r.restart_count},
                         {"members", r.members},
                         {"took_s", std::chrono::duration<double>(took).count()}});
}

// The job's one summary line, and its event.
void Agent::Impl::emit_job_end(const JobResult& result) {
  const double wall = seconds(Clock::now() - agent_started_);
  const int restarts = group_.round().restart_count;
  sys::log_line("job summary: " + plural(attempts_, "attempt") + ", " +
                plural(static_cast<uint64_t>(restarts), "restart") + ", " +
                plural(reformations_, "re-formation") + ", " + plural(hangs_, "hang") +
                ", wall time " + one_decimal(wall) + " s");
  events_.emit("job_end", {{"result", result_name(result.kind)},
                           {"reason", result.what},
                           {"attempts", attempts_},
                           {"restarts", restarts},
                           {"reformations", reformations_},
                           {"hangs", hangs_},
                           {"wall_s", wall}});
}

}  // namespace ddprun::agent
