#include "agent/event_log_observer.hpp"

#include "agent/failure.hpp"

namespace ddprun::agent {
namespace {

const char* hang_kind(Hang::Kind k) {
  switch (k) {
    case Hang::Kind::kNoHeartbeat:
      return "no_heartbeat";
    case Hang::Kind::kNoFirstHeartbeat:
      return "no_first_heartbeat";
    case Hang::Kind::kTimerExpired:
      return "timer_expired";
  }
  return "?";
}

}  // namespace

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

void EventLogObserver::on_round(const RendezvousInfo& r, Millis took) {
  log_.emit("round", {{"round", r.round},
                      {"group_rank", r.group_rank},
                      {"group_world_size", r.group_world_size},
                      {"world_size", r.world_size},
                      {"restart_count", r.restart_count},
                      {"members", r.members},
                      {"took_s", std::chrono::duration<double>(took).count()}});
}

void EventLogObserver::on_restart(const RendezvousInfo& r) {
  log_.emit("restart", {{"attempt", r.restart_count},
                        {"restart_count", r.restart_count},
                        {"max_restarts", r.max_restarts}});
}

void EventLogObserver::on_attempt(const RendezvousInfo& r,
                                  const std::vector<StartedWorker>& workers) {
  for (const StartedWorker& w : workers) {
    log_.emit("worker_start", {{"local_rank", w.local_rank},
                               {"rank", w.rank},
                               {"pid", w.pid},
                               {"attempt", r.restart_count}});
  }
}

void EventLogObserver::on_worker_replaced(const RendezvousInfo& r, const StartedWorker& w,
                                          int generation) {
  log_.emit("worker_replaced", {{"local_rank", w.local_rank},
                                {"rank", w.rank},
                                {"pid", w.pid},
                                {"attempt", r.restart_count},
                                {"generation", generation}});
}

void EventLogObserver::on_worker_exit(const ExitedWorker& e) {
  nlohmann::json fields = {{"local_rank", e.local_rank}, {"pid", e.pid}, {"attempt", e.attempt}};
  if (e.rank >= 0) fields["rank"] = e.rank;
  switch (e.status.kind) {
    case ExitStatus::Kind::kExited:
      fields["exit_code"] = e.status.value;
      break;
    case ExitStatus::Kind::kSignaled:
      fields["signal"] = signal_name(e.status.value);
      break;
    case ExitStatus::Kind::kExecFailed:
      fields["exec_failed"] = e.status.describe();
      break;
  }
  if (!e.cause.empty()) fields["cause"] = e.cause;
  if (e.peak_rss_kb) fields["peak_rss_bytes"] = e.peak_rss_kb * 1024;
  log_.emit("worker_exit", std::move(fields));
}

void EventLogObserver::on_hang_ignored(const Hang& hang, int rank) {
  log_.emit("hang", {{"local_rank", hang.local_rank},
                     {"rank", rank},
                     {"pid", hang.pid},
                     {"kind", hang_kind(hang.kind)},
                     {"reason", hang.describe()},
                     {"action", "none"}});
}

void EventLogObserver::on_hang_captured(const Hang& hang, int rank, const StackDump& stacks,
                                        int attempt) {
  log_.emit("hang", {{"local_rank", hang.local_rank},
                     {"rank", rank},
                     {"pid", hang.pid},
                     {"kind", hang_kind(hang.kind)},
                     {"reason", hang.describe()},
                     {"stacks", stacks.path},
                     {"stacks_s", std::chrono::duration<double>(stacks.took).count()},
                     {"attempt", attempt}});
}

void EventLogObserver::on_collective_judged(const CollectiveVerdict& v, int attempt) {
  log_.emit("collective_hang", {{"summary", v.line},
                                {"seq", v.seq},
                                {"op", v.op},
                                {"pg", v.pg},
                                {"waiting", v.waiting},
                                {"culprits", v.culprits},
                                {"source", v.from_flight_recorder ? "flight_recorder" : "stacks"},
                                {"attempt", attempt}});
}

void EventLogObserver::on_exit_hang(const StartedWorker& w, const std::string& why,
                                    const StackDump& stacks, int attempt) {
  log_.emit("exit_hang", {{"local_rank", w.local_rank},
                          {"rank", w.rank},
                          {"pid", w.pid},
                          {"reason", why},
                          {"stacks", stacks.path},
                          {"attempt", attempt}});
}

void EventLogObserver::on_transition(WorkerState from, const Decision& d, const Observed& seen,
                                     const RendezvousInfo& r) {
  if (!log_.enabled()) return;
  nlohmann::json fields = {{"from", to_string(from)},
                           {"to", to_string(d.next)},
                           {"on", to_string(seen.event)},
                           {"action", to_string(d.action)},
                           {"round", r.round},
                           {"restart_count", r.restart_count},
                           {"max_restarts", r.max_restarts},
                           {"world_size", r.world_size}};
  if (!seen.what.empty()) fields["reason"] = seen.what;
  log_.emit("transition", std::move(fields));
}

void EventLogObserver::on_job_end(const JobResult& result, const RendezvousInfo&) {
  log_.emit("job_end", {{"result", result_name(result.kind)},
                        {"reason", result.what},
                        {"attempts", summary_.attempts()},
                        {"restarts", summary_.restarts()},
                        {"reformations", summary_.reformations()},
                        {"hangs", summary_.hangs()},
                        {"wall_s", summary_.uptime_s()}});
}

}  // namespace ddprun::agent
