#include "agent/agent.hpp"

#include <signal.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <set>

#include "agent/agent_impl.hpp"
#include "store/sys/console.hpp"
#include "store/sys/fd.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"
#include "store/sys/time_text.hpp"
#include "store/sys/wakeup.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;

namespace {

Observed observed(const RoundEnd& end, bool own_failure) {
  switch (end.kind) {
    case RoundEnd::Kind::kSucceeded:
      return {Event::kJobDone, false, end.what};
    case RoundEnd::Kind::kWorkerFailed:
      return {own_failure ? Event::kWorkerFailed : Event::kPeerFailed, end.restart_allowed,
              end.what};
    case RoundEnd::Kind::kNodeJoined:
      return {Event::kNodeJoined, false, end.what};
    case RoundEnd::Kind::kNodeLost:
      return {Event::kNodeLost, false, end.what};
    case RoundEnd::Kind::kStoreLost:
      break;
  }
  return {Event::kStoreLost, false, end.what};
}

}  // namespace

Agent::Impl::Impl(asio::io_context& io, WorkerSpec spec, std::unique_ptr<RendezvousHandler> rdzv,
                  Guardian* guardian)
    : io_(io),
      spec_(std::move(spec)),
      rdzv_(std::move(rdzv)),
      guardian_(guardian),
      group_(spec_, rdzv_->run_id()),
      wake_(io.get_executor()),
      signals_(io) {
  reset_signals_ = spec_.signals_to_handle;
  reset_signals_.push_back(SIGPIPE);
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
  pctx_.reset();  // kills and reaps anything left (only after an internal error)
  health_.reset();
  watchdog_.reset();
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
  rdzv_->on_round_end([this] { wake_.notify(); });
  if (auto failed = open_watch()) {
    Decision d = decide(WorkerState::kInit, failed->event, false);
    co_return co_await leave(d, *failed);
  }
  for (;;) {
    std::optional<Observed> early = co_await rendezvous_phase();
    if (!early) early = start_phase();
    if (early) {
      Decision d = decide(WorkerState::kInit, early->event, false);
      transition(d, *early);
      co_return co_await leave(d, *early);
    }
    group_.set_state(WorkerState::kHealthy);
    log_started();

    Observed seen = co_await monitor_phase();
    Decision d = decide(WorkerState::kHealthy, seen.event, seen.restart_allowed);
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
    group_.set_state(d.next);
  }
}

asio::awaitable<std::optional<Observed>> Agent::Impl::rendezvous_phase() {
  const int previous_restarts = group_.round().restart_count;
  const bool first = !pctx_;
  RendezvousInfo info;
  const auto began = Clock::now();
  // A signal that came while the previous round's workers were being stopped (a re-form or a
  // restart) found no rendezvous to interrupt: honour it before waiting for a new round.
  if (signal_) co_return Observed{Event::kSignal, false, {}};
  try {
    in_rendezvous_ = true;
    info = co_await rdzv_->next_rendezvous(spec_.local_world_size);
    in_rendezvous_ = false;
  } catch (const RendezvousError& e) {
    in_rendezvous_ = false;
    if (signal_) co_return Observed{Event::kSignal, false, {}};
    // A member of a job that finished while it re-formed leaves with success.
    if (e.exit_code() == 0) co_return Observed{Event::kJobDone, false, e.what()};
    co_return Observed{Event::kRendezvousFailed, false, std::string("error: ") + e.what()};
  }
  if (signal_) co_return Observed{Event::kSignal, false, {}};
  group_.assign(info);
  emit_round(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began));
  if (!first && info.restart_count > previous_restarts) {
    sys::log_line("restarting the worker group: attempt " + std::to_string(info.restart_count) +
                  " (" + std::to_string(info.restart_count) + " of " +
                  std::to_string(info.max_restarts) + " restarts used)");
    events_.emit("restart", {{"attempt", info.restart_count},
                             {"restart_count", info.restart_count},
                             {"max_restarts", info.max_restarts}});
  }
  co_return std::nullopt;
}

std::optional<Observed> Agent::Impl::start_phase() {
  const RendezvousInfo& round = group_.round();
  try {
    attempt_dir_ = logs_->make_attempt(round.restart_count, spec_.local_world_size);
    reported_.clear();
    failures_.clear();
    first_success_.reset();
    pending_hangs_.clear();
    hung_.clear();
    exit_hung_.clear();
    pctx_ = std::make_unique<ProcessContext>(io_, guardian_,
                                             [this](int rank) { on_worker_exit(rank); });
    pctx_->start(spec_.program, make_launches(group_, attempt_dir_, filtered_), reset_signals_);
  } catch (const std::exception& e) {
    pctx_.reset();
    return Observed{Event::kStartFailed, false,
                    std::string("error: cannot start the workers: ") + e.what()};
  }
  started_ = Clock::now();
  ++attempts_;
  watch_attempt();
  return std::nullopt;
}

asio::awaitable<Observed> Agent::Impl::monitor_phase() {
  while (!signal_ && !any_failed() && !pctx_->all_exited() && !rdzv_->round_end() &&
         pending_hangs_.empty()) {
    if (auto deadline = exit_deadline()) {
      if (!co_await wake_.wait_until(*deadline)) co_await handle_exit_hang();
    } else {
      co_await wake_.wait();
    }
  }
  if (signal_) co_return Observed{Event::kSignal, false, {}};
  if (auto ended = rdzv_->round_end()) {  // another node, or the store, ended the round
    sys::log_line("round " + std::to_string(group_.round().round) + ": " + ended->what +
                  ": stopping " + std::to_string(pctx_->running()) + " running worker(s)");
    failures_ = collect_failures(false);
    co_return observed(*ended, false);
  }
  if (pending_hangs_.empty() && !any_failed()) {
    co_return Observed{Event::kWorkersSucceeded, false, {}};
  }
  group_.set_state(WorkerState::kUnhealthy);
  const bool hung = !pending_hangs_.empty();
  if (hung) co_await capture_hangs();
  failures_ = collect_failures(false);
  RoundEnd end = co_await rdzv_->report_failure();  // first event of the round wins
  Observed seen = observed(end, true);
  if (hung && seen.event == Event::kWorkerFailed) seen.event = Event::kWorkerHung;
  co_return seen;
}

asio::awaitable<Observed> Agent::Impl::exit_barrier_phase() {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started_);
  in_rendezvous_ = true;
  RoundEnd end = co_await rdzv_->report_success();
  in_rendezvous_ = false;
  if (signal_) co_return Observed{Event::kSignal, false, {}};
  if (end.kind == RoundEnd::Kind::kSucceeded) {
    const size_t stopped = exit_hung_.size();
    sys::log_line("attempt " + std::to_string(group_.round().restart_count) + ": " +
                  (stopped
                       ? std::to_string(spec_.local_world_size - stopped) + " of " +
                             std::to_string(spec_.local_world_size) + " workers exited 0, " +
                             std::to_string(stopped) + " stopped after --exit-timeout ("
                       : "all " + std::to_string(spec_.local_world_size) + " workers exited 0 (") +
                  std::to_string(ms.count()) + " ms)");
  } else {
    sys::log_line("round " + std::to_string(group_.round().round) +
                  ": this node's workers exited 0, but " + end.what +
                  " before every node finished");
  }
  co_return observed(end, false);
}

// One line per transition, with the values that matter. The reason of a transition that ends
// the job is the launcher's last line (JobResult::what), not repeated here.
void Agent::Impl::transition(const Decision& d, const Observed& seen) {
  if (d.next == group_.state()) return;  // e.g. waiting in the exit barrier
  emit_transition(d, seen);
  if (d.action == Action::kReform) ++reformations_;
  const RendezvousInfo& r = group_.round();
  std::string line = std::string(to_string(group_.state())) + " -> " +
                     std::string(to_string(d.next)) + " on " + std::string(to_string(seen.event)) +
                     ": " + std::string(to_string(d.action));
  if (!group_.workers().empty()) {
    line += " (round " + std::to_string(r.round) + ", restart count " +
            std::to_string(r.restart_count) + " of " + std::to_string(r.max_restarts) +
            ", world size " + std::to_string(r.world_size) + ")";
  }
  const bool continues = d.action == Action::kRestart || d.action == Action::kReform;
  if (continues && !seen.what.empty()) line += ": " + seen.what;
  sys::log_line(line);
  if (d.action == Action::kReform) {
    sys::log_line("re-forming the worker group without spending a restart (restart count stays " +
                  std::to_string(r.restart_count) + ")");
  }
}

asio::awaitable<void> Agent::Impl::stop_phase() {
  if (watchdog_) watchdog_->unwatch();
  if (pctx_) co_await stop_running(signal_.value_or(SIGTERM));
  // Workers that died of our stop signal are no failures of their own, unless they wrote an
  // error file while stopping. Hung workers are, with their stacks.
  if (pctx_) {
    for (auto& f : collect_failures(true)) failures_.push_back(std::move(f));
    add_hang_failures();
  }
  group_.set_state(WorkerState::kStopped);
}

// `sig` to every running worker's process group, --shutdown-timeout grace, SIGKILL, reaped.
asio::awaitable<void> Agent::Impl::stop_running(int sig) {
  if (pctx_->all_exited()) co_return;
  pctx_->signal_all(sig);
  // A stopped worker (SIGSTOP, a debugger gone) holds the signal until it runs again.
  if (sig != SIGKILL) pctx_->signal_all(SIGCONT);
  const auto deadline = Clock::now() + spec_.shutdown_timeout;
  while (!pctx_->all_exited() && !escalate_) {
    if (!co_await wake_.wait_until(deadline)) break;
  }
  if (!pctx_->all_exited()) {
    if (!escalate_) {
      sys::log_line(std::to_string(pctx_->running()) + " worker(s) still running " +
                    sys::seconds_text(spec_.shutdown_timeout) + " after " + signal_name(sig) +
                    ": sending SIGKILL");
    }
    pctx_->signal_all(SIGKILL);
    while (!pctx_->all_exited()) co_await wake_.wait();
  }
}

asio::awaitable<JobResult> Agent::Impl::leave(const Decision& d, const Observed& seen) {
  const bool from_init = group_.state() == WorkerState::kInit;
  RendezvousHandler::Exit how = RendezvousHandler::Exit::kLeaving;
  if (d.action == Action::kSucceed) how = RendezvousHandler::Exit::kSucceeded;
  if (d.action == Action::kFail) how = RendezvousHandler::Exit::kFailed;
  co_await rdzv_->shutdown(how);
  group_.set_state(d.next);
  if (!failures_.empty() && (d.action == Action::kFail || seen.event == Event::kSignal)) {
    std::string summary =
        "\n" + format_failure_summary(spec_.entrypoint_name, failures_, sys::host_name());
    sys::Console::write(STDERR_FILENO, summary, sys::LineKind::kOwn);
  }
  if (d.action == Action::kSucceed && !keep_logs_) logs_->remove_temporary();
  JobResult result = result_of(d, seen, from_init);
  emit_job_end(result);
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

// Workers stopped after --exit-timeout are not failures: their work was done.
bool Agent::Impl::any_failed() const {
  for (size_t r = 0; r < pctx_->size(); ++r) {
    if (exit_hung_.count(static_cast<int>(r))) continue;
    const auto& e = pctx_->exit_of(static_cast<int>(r));
    if (e && !e->status.success()) return true;
  }
  return false;
}

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
    if (pctx_) pctx_->signal_all(SIGKILL);
  } else {
    signal_ = sig;
    size_t running = pctx_ ? pctx_->running() : 0;
    sys::log_line("received " + signal_name(sig) + ": forwarding it to " + std::to_string(running) +
                  " running worker(s), SIGKILL after " + sys::seconds_text(spec_.shutdown_timeout) +
                  " (a second signal kills them now)");
    if (in_rendezvous_) rdzv_->interrupt();
  }
  wake_.notify();
}

Agent::Agent(asio::io_context& io, WorkerSpec spec, std::unique_ptr<RendezvousHandler> rdzv,
             Guardian* guardian)
    : impl_(std::make_unique<Impl>(io, std::move(spec), std::move(rdzv), guardian)) {}

Agent::~Agent() = default;

JobResult Agent::run() {
  return impl_->run();
}

}  // namespace ddprun::agent
