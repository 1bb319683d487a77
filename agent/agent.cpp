// The agent's core: construction, the loop, its event sources and what it tells its observers.
// The phases are in agent_phases.cpp.
#include "agent/agent.hpp"

#include <signal.h>
#include <stdlib.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <chrono>

#include "agent/agent_impl.hpp"
#include "store/sys/console.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;

Agent::Impl::Impl(asio::io_context& io, WorkerSpec spec, std::unique_ptr<RendezvousHandler> rdzv,
                  Guardian* guardian)
    : io_(io),
      spec_(std::move(spec)),
      rdzv_(std::move(rdzv)),
      guardian_(guardian),
      group_(spec_, rdzv_->run_id()),
      queue_(io.get_executor()),
      signals_(io) {
  reset_signals_ = spec_.signals_to_handle;
  reset_signals_.push_back(SIGPIPE);
  observers_.add(&summary_);  // first: the others read its counts
}

JobResult Agent::Impl::run() {
  for (int sig : spec_.signals_to_handle) signals_.add(sig);
  arm_signals();
  JobResult result{JobResult::Kind::kStartFailed, {}, 0, "internal error"};
  asio::co_spawn(io_, loop(), [&](std::exception_ptr error, JobResult r) {
    result = std::move(r);
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        result = {JobResult::Kind::kStartFailed, {}, 0, std::string("error: ") + e.what()};
      }
    }
    io_.stop();
  });
  io_.run();
  signals_.clear();
  standby_.reset();
  pctx_.reset();  // kills and reaps anything left (only after an internal error)
  warm_.reset();
  if (status_) status_->stop_serving();
  replicas_.reset();
  memory_.reset();  // the job's end: its in-memory checkpoints go
  hangs_.reset();
  return result;
}

asio::awaitable<JobResult> Agent::Impl::loop() {
  try {
    logs_.emplace(spec_.log_dir, rdzv_->run_id());
  } catch (const std::exception& e) {
    co_return JobResult{JobResult::Kind::kStartFailed, {}, 0, std::string("error: ") + e.what()};
  }
  keep_logs_ = !logs_->temporary() || spec_.redirects.is_map() || spec_.tee.is_map() ||
               spec_.redirects.for_rank(0) != Std::kNone || spec_.tee.for_rank(0) != Std::kNone;
  rdzv_->on_round_end([this] { queue_.push(RoundEnded{}); });
  rdzv_->on_peer_recovery([this](const RendezvousHandler::PeerRecovery& p) {
    peer_recovery_ = p;
    queue_.push(PeerRecoveryBegan{});
  });
  if (auto failed = open_parts()) {
    Decision d = decide(WorkerState::kInit, failed->event, false);
    co_return co_await leave(d, *failed);
  }
  for (;;) {
    std::optional<Observed> early = co_await rendezvous_phase();
    if (!early && warm_) {
      co_await warm_->wait_until_settled([this] { return signal_.has_value(); });
      if (signal_) early = Observed{Event::kSignal, false, {}};
    }
    if (!early) early = start_phase();
    if (early) {
      Decision d = decide(WorkerState::kInit, early->event, false);
      transition(d, *early);
      co_return co_await leave(d, *early);
    }
    set_state(WorkerState::kHealthy);
    log_started();

    Observed seen;
    Decision d{Action::kExit, false, WorkerState::kStopped};
    for (;;) {  // until an event ends the attempt: in-process recoveries keep it going
      const WorkerState monitored = group_.state();
      seen = co_await monitor_phase();
      d = decide(monitored, seen.event, seen.restart_allowed);
      if (d.action != Action::kReplace && d.action != Action::kResume &&
          d.action != Action::kFollow) {
        break;
      }
      transition(d, seen);
      if (d.action == Action::kReplace) replace_failed();
      if (d.action == Action::kFollow) follow_peer();
      if (d.action == Action::kResume) recovery_done();
      set_state(d.next);
    }
    if (d.action == Action::kAwaitOthers) {
      transition(d, seen);
      seen = co_await exit_barrier_phase();
      d = decide(WorkerState::kHealthy, seen.event, seen.restart_allowed);
    }
    transition(d, seen);
    if (d.stop_workers) co_await stop_phase();
    if (d.action != Action::kRestart && d.action != Action::kReform) {
      co_return co_await leave(d, seen);
    }
    set_state(d.next);
  }
}

// The hang monitor (heartbeats for the workers, hang detection when asked for), the event log
// and the health endpoints. Only what was asked for can fail the start.
std::optional<Observed> Agent::Impl::open_parts() {
  const bool judging =
      spec_.hang_timeout.count() > 0 || spec_.hang_start_timeout.count() > 0 || spec_.file_timer;
  try {
    if (!spec_.event_log.empty()) {
      event_log_ =
          std::make_unique<EventLogObserver>(EventLog(spec_.event_log, group_.run_id()), summary_);
      observers_.add(event_log_.get());
    }
    hangs_ = std::make_unique<HangMonitor>(io_, spec_, [this](const Hang& h) { on_hang(h); });
    group_.set_endpoints(hangs_->endpoints());
  } catch (const std::exception& e) {
    if (judging || !spec_.event_log.empty()) {
      return Observed{Event::kStartFailed, false, std::string("error: ") + e.what()};
    }
    sys::log_line(std::string("warning: no heartbeat socket for the workers: ") + e.what());
  }
  open_memory_checkpoints();
  if (spec_.warm_start && spec_.python) {
    warm_ = std::make_unique<WarmStart>(spec_, logs_->path(), reset_signals_, guardian_);
  }
  status_ = std::make_unique<StatusObserver>(group_.run_id(), summary_,
                                             hangs_ ? &hangs_->watchdog() : nullptr);
  status_->set_memory_checkpoints(memory_.get());
  observers_.add(status_.get());
  if (spec_.health_port) {
    int port = 0;
    try {
      port = status_->serve(io_, spec_.health_host, *spec_.health_port);
    } catch (const std::exception& e) {
      return Observed{Event::kStartFailed, false, std::string("error: ") + e.what()};
    }
    sys::log_line("health endpoints: http://" + sys::endpoint_text(spec_.health_host, port) +
                  "/healthz, /metrics, /status");
  }
  return std::nullopt;
}

// The job's in-memory checkpoint directory, when asked for. Workers that cannot have one still
// run (their memory saves are refused with an error that says why, and they fall back to files).
void Agent::Impl::open_memory_checkpoints() {
  uint64_t limit = spec_.memory_checkpoint_bytes;
  if (spec_.memory_checkpoint_percent > 0) {
    struct sysinfo info {};
    if (::sysinfo(&info) == 0) {
      limit = static_cast<uint64_t>(static_cast<double>(info.totalram) * info.mem_unit *
                                    spec_.memory_checkpoint_percent / 100);
    }
  }
  if (limit == 0) return;
  try {
    memory_ = std::make_unique<MemoryCheckpoints>(group_.run_id(), limit, guardian_);
  } catch (const std::exception& e) {
    sys::log_line(std::string("warning: no in-memory checkpoints for this job: ") + e.what());
    return;
  }
  if (rdzv_->spans_nodes()) {
    try {
      replicas_ = std::make_unique<CheckpointReplicas>(io_, memory_->path(), memory_->limit(),
                                                       group_.run_id());
      rdzv_->set_replica_port(replicas_->port());
    } catch (const std::exception& e) {
      sys::log_line(std::string("warning: in-memory checkpoints stay on this node only: ") +
                    e.what());
    }
  }
  AgentEndpoints endpoints = group_.endpoints();
  endpoints.memory_checkpoint_dir = memory_->path();
  endpoints.memory_checkpoint_limit = memory_->limit();
  group_.set_endpoints(std::move(endpoints));
}

void Agent::Impl::set_state(WorkerState state) {
  group_.set_state(state);
  observers_.each([&](AgentObserver& o) { o.on_state(state); });
}

// One line per transition, with the values that matter. The reason of a transition that ends
// the job is the launcher's last line (JobResult::what), not repeated here.
void Agent::Impl::transition(const Decision& d, const Observed& seen) {
  if (d.next == group_.state()) return;  // e.g. waiting in the exit barrier
  const RendezvousInfo& r = group_.round();
  observers_.each([&](AgentObserver& o) { o.on_transition(group_.state(), d, seen, r); });
  std::string line = std::string(to_string(group_.state())) + " -> " +
                     std::string(to_string(d.next)) + " on " + std::string(to_string(seen.event)) +
                     ": " + std::string(to_string(d.action));
  if (!group_.workers().empty()) {
    line += " (round " + std::to_string(r.round) + ", restart count " +
            std::to_string(r.restart_count) + " of " + std::to_string(r.max_restarts) +
            ", world size " + std::to_string(r.world_size) + ")";
  }
  const bool continues =
      d.action == Action::kRestart || d.action == Action::kReform || d.action == Action::kReplace;
  if (continues && !seen.what.empty()) line += ": " + seen.what;
  sys::log_line(line);
  if (d.action == Action::kReform) {
    sys::log_line("re-forming the worker group without spending a restart (restart count stays " +
                  std::to_string(r.restart_count) + ")");
  }
}

asio::awaitable<JobResult> Agent::Impl::leave(const Decision& d, const Observed& seen) {
  const bool from_init = group_.state() == WorkerState::kInit;
  standby_.reset();
  co_await sweep_orphans();
  RendezvousHandler::Exit how = RendezvousHandler::Exit::kLeaving;
  if (d.action == Action::kSucceed) how = RendezvousHandler::Exit::kSucceeded;
  if (d.action == Action::kFail) how = RendezvousHandler::Exit::kFailed;
  co_await rdzv_->shutdown(how);
  set_state(d.next);
  if (!failures_.empty() && (d.action == Action::kFail || seen.event == Event::kSignal)) {
    std::string summary =
        "\n" + format_failure_summary(spec_.entrypoint_name, failures_, sys::host_name());
    sys::Console::write(STDERR_FILENO, summary, sys::LineKind::kOwn);
    if (const char* path = ::getenv("TORCHELASTIC_ERROR_FILE"); path && *path) {
      if (std::string error = write_launcher_error_file(failures_, path); !error.empty()) {
        sys::log_line("warning: " + error);
      }
    }
  }
  if (d.action == Action::kSucceed && !keep_logs_) logs_->remove_temporary();
  JobResult result = result_of(d, seen, from_init);
  observers_.each([&](AgentObserver& o) { o.on_job_end(result, group_.round()); });
  co_return result;
}

JobResult Agent::Impl::result_of(const Decision& d, const Observed& seen, bool from_init) const {
  using K = JobResult::Kind;
  const RendezvousInfo& r = group_.round();
  switch (d.action) {
    case Action::kSucceed:
      // Said only when the job ended while this node was not running it (a late member).
      return JobResult{K::kSucceeded, {}, 0, from_init ? seen.what : std::string()};
    case Action::kFail: {
      if (failures_.empty()) {
        return JobResult{K::kWorkersFailed,
                         {},
                         0,
                         "job failed: " + seen.what + " and no restarts are left (" +
                             std::to_string(r.restart_count) + " of " +
                             std::to_string(r.max_restarts) + " used)"};
      }
      const ProcessFailure& root = root_cause(failures_);
      const std::string how = root.hang.empty() ? root.status.describe() : "hung: " + root.hang;
      return JobResult{root.hang.empty() ? K::kWorkersFailed : K::kWorkerHung, root.status, 0,
                       "job failed after " + std::to_string(r.restart_count) +
                           " restart(s); the root cause, rank " + std::to_string(root.global_rank) +
                           ", " + how};
    }
    default:
      break;
  }
  if (seen.event == Event::kSignal) {
    return JobResult{K::kSignaled, {}, *signal_, "workers stopped after " + signal_name(*signal_)};
  }
  if (seen.event == Event::kStoreLost) {
    return JobResult{K::kStoreLost, {}, 0, "error: " + seen.what + "; workers stopped"};
  }
  if (seen.event == Event::kStartFailed) return JobResult{K::kStartFailed, {}, 0, seen.what};
  return JobResult{K::kRendezvousFailed, {}, 0, seen.what};
}

std::vector<ProcessFailure> Agent::Impl::collect_failures(bool only_with_error_file) {
  return collect_new_failures(group_, *pctx_, reported_, only_with_error_file);
}

void Agent::Impl::log_started() {
  const RendezvousInfo& r = group_.round();
  const auto& ws = group_.workers();
  std::string ranks = ws.empty() ? "-"
                                 : std::to_string(ws.front().global_rank) + "-" +
                                       std::to_string(ws.back().global_rank);
  sys::log_line(
      "attempt " + std::to_string(r.restart_count) + ": started " + std::to_string(ws.size()) +
      " worker(s) (world size " + std::to_string(r.world_size) + ", ranks " + ranks + ", store " +
      sys::endpoint_text(r.store_host, r.store_port) + ", run id " + group_.run_id() +
      ", max restarts " + std::to_string(r.max_restarts) + ", logs " + logs_->path() + ")");
}

// Source: signals. The first is forwarded at once and interrupts a rendezvous wait; a second
// escalates to SIGKILL. The loop then reads the event.
void Agent::Impl::arm_signals() {
  signals_.async_wait([this](boost::system::error_code ec, int sig) {
    if (ec) return;
    on_signal(sig);
    arm_signals();
  });
}

void Agent::Impl::on_signal(int sig) {
  if (signal_) {
    escalate_ = true;
    sys::log_line("received " + signal_name(sig) + " again: killing the workers now");
    if (pctx_) pctx_->signal_all(SIGKILL, "on a second signal to ddprun");
  } else {
    signal_ = sig;
    size_t running = pctx_ ? pctx_->running() : 0;
    sys::log_line("received " + signal_name(sig) + ": forwarding it to " + std::to_string(running) +
                  " running worker(s), SIGKILL after " + sys::seconds_text(spec_.shutdown_timeout) +
                  " (a second signal kills them now)");
    if (in_rendezvous_) rdzv_->interrupt();
  }
  queue_.push(SignalReceived{sig});
}

// Source: worker exits (the process context's pidfd waits).
void Agent::Impl::on_worker_exit(int local_rank) {
  if (hangs_) hangs_->worker_exited(local_rank);
  const auto& e = pctx_->exit_of(local_rank);
  if (e) {
    ExitedWorker exited{
        local_rank,     -1,      pctx_->pid_of(local_rank), e->status, group_.round().restart_count,
        e->peak_rss_kb, e->cause};
    if (local_rank < static_cast<int>(group_.workers().size())) {
      exited.rank = group_.workers()[local_rank].global_rank;
    }
    observers_.each([&](AgentObserver& o) { o.on_worker_exit(exited); });
    if (e->status.success() && !first_success_) first_success_ = Clock::now();
  }
  queue_.push(WorkerExited{local_rank});
}

// Source: hangs (the hang monitor's watchdog). Only a hang of a healthy group is acted on.
void Agent::Impl::on_hang(const Hang& hang) {
  const Worker& w = group_.workers().at(hang.local_rank);
  if (group_.state() != WorkerState::kHealthy) return;  // already stopping the group
  if (hang.kind == Hang::Kind::kTimerExpired && hang.signal <= 0) {
    sys::log_line(worker_name(w, hang.pid) + ": " + hang.describe() +
                  "; the client asked for no signal, so it is left running");
    observers_.each([&](AgentObserver& o) { o.on_hang_ignored(hang, w.global_rank); });
    return;
  }
  if (hang.kind != Hang::Kind::kTimerExpired && first_success_) {
    // Another worker already exited 0: this one may be finishing its part (rank 0 saving a
    // checkpoint). --exit-timeout judges it, not the heartbeat.
    sys::log_line(worker_name(w, hang.pid) + ": " + hang.describe() +
                  " after another worker exited 0: left to --exit-timeout");
    return;
  }
  hangs_->found(hang);
  observers_.each([&](AgentObserver& o) { o.on_hang_found(hang, w.global_rank); });
  queue_.push(HangFound{hang});
}

Agent::Agent(asio::io_context& io, WorkerSpec spec, std::unique_ptr<RendezvousHandler> rdzv,
             Guardian* guardian)
    : impl_(std::make_unique<Impl>(io, std::move(spec), std::move(rdzv), guardian)) {}

Agent::~Agent() = default;

JobResult Agent::run() {
  return impl_->run();
}

}  // namespace ddprun::agent
