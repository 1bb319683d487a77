// The agent loop's phases: rendezvous, start, monitor (the events of a running attempt), the
// exit barrier and the stop. Each returns what ended it; the loop (agent.cpp) asks the state
// machine what that means.
#include <signal.h>

#include <chrono>

#include "agent/agent_impl.hpp"
#include "agent/process/orphan_sweep.hpp"
#include "store/sys/log.hpp"
#include "store/sys/time_text.hpp"

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
  if (replicas_ && info.replica_ports.size() == info.members.size()) {
    std::vector<ReplicaPeer> peers;
    for (size_t i = 0; i < info.members.size(); ++i) {
      peers.push_back({info.members[i], info.replica_ports[i]});
    }
    co_await replicas_->round_formed(info.group_rank, info.round, std::move(peers));
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began);
  observers_.each([&](AgentObserver& o) { o.on_round(info, took); });
  if (!first && info.restart_count > previous_restarts) {
    sys::log_line("restarting the worker group: attempt " + std::to_string(info.restart_count) +
                  " (" + std::to_string(info.restart_count) + " of " +
                  std::to_string(info.max_restarts) + " restarts used)");
    observers_.each([&](AgentObserver& o) { o.on_restart(info); });
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
    exit_hung_.clear();
    queue_.clear();  // the last attempt's exits and round ends are of no concern now
    pctx_.reset();   // the previous attempt's processes, before a warm start forks new ones
    if (memory_) memory_->remove_partial_saves();  // a killed worker's unfinished save
    recovery_.reset();
    standby_.reset();
    peer_recovery_.reset();
    shared_generation_.reset();
    formed_everywhere_ = true;
    if (spec_.in_process_recovery) {
      recovery_ = std::make_unique<InProcessRecovery>(recovery_dir(attempt_dir_));
    }
    pctx_ = std::make_unique<ProcessContext>(
        io_, guardian_, [this](int rank) { on_worker_exit(rank); }, &kill_causes_);
    pctx_->start(spec_.program, make_launches(group_, attempt_dir_, filtered_), reset_signals_,
                 warm_ ? warm_->spawner() : ProcessContext::WarmSpawn{});
  } catch (const std::exception& e) {
    pctx_.reset();
    return Observed{Event::kStartFailed, false,
                    std::string("error: cannot start the workers: ") + e.what()};
  }
  started_ = Clock::now();
  standby_due_.reset();
  if (recovery_ && spec_.recovery_standby && !spec_.python) standby_due_ = started_;
  std::vector<StartedWorker> started;
  std::vector<WatchedWorker> watched;
  for (const Worker& w : group_.workers()) {
    const pid_t pid = pctx_->pid_of(w.local_rank);
    started.push_back({w.local_rank, w.global_rank, pid});
    watched.push_back({w.local_rank, w.global_rank, pid});
  }
  observers_.each([&](AgentObserver& o) { o.on_attempt(round, started); });
  if (hangs_) hangs_->watch(std::move(watched));
  return std::nullopt;
}

// The running attempt, event by event, until one ends it. Each event is recorded by its
// source before it is queued, so the loop judges the attempt as it stands after it; what came
// before this phase (a worker that exited at once, a signal during the start) is judged first.
asio::awaitable<Observed> Agent::Impl::monitor_phase() {
  for (;;) {
    co_await share_generation();
    if (auto seen = judge()) {
      if (seen->event == Event::kWorkerFailed) {
        if (auto replace = co_await replaceable()) co_return *replace;
        co_return co_await worker_failed();
      }
      if (seen->event == Event::kPeerRecovering) {
        if (auto why = cannot_follow()) co_return co_await abandon_recovery(*why);
        group_.set_restart_count(peer_recovery_->restart_count);
      }
      if (hangs_ && seen->event == Event::kPeerFailed && rdzv_->round_end()->hang) {
        co_await hangs_->capture_for_peer(attempt());
        co_await explain_hang();
      }
      co_return *seen;
    }
    const auto exit_at = exit_deadline().value_or(Clock::time_point::max());
    // While a recovery runs, the workers' answers are files: looked at every few ms; so are
    // their first announcements, for the standby.
    prepare_standby();
    // Across nodes, so are the workers' announcements: the other nodes are told of each change.
    auto deadline = exit_at;
    if (recovery_ && recovery_->recovering()) {
      deadline = std::min(deadline, Clock::now() + kRecoveryPoll);
    } else if (standby_due_ || (recovery_ && rdzv_->spans_nodes())) {
      deadline = std::min(deadline, Clock::now() + kStandbyPoll);
    }
    if (!co_await queue_.pop_until(deadline) && Clock::now() >= exit_at) {
      co_await handle_exit_hang();  // stops the stragglers: the attempt's work is done
    }
  }
}

// What ends the attempt now, by precedence: a signal, the round's end (another node, or the
// store), a failed or hung worker of this node, every worker done.
std::optional<Observed> Agent::Impl::judge() {
  if (signal_) return Observed{Event::kSignal, false, {}};
  if (auto ended = rdzv_->round_end()) {
    sys::log_line("round " + std::to_string(group_.round().round) + ": " + ended->what +
                  ": stopping " + std::to_string(pctx_->running()) + " running worker(s)");
    failures_ = collect_failures(false);
    return observed(*ended, false);
  }
  if ((hangs_ && hangs_->any_found()) || any_failed()) {
    return Observed{Event::kWorkerFailed, false, {}};
  }
  if (recovery_ && peer_recovery_ && peer_recovery_->generation > recovery_->generation()) {
    return Observed{Event::kPeerRecovering, false,
                    peer_recovery_->who + " replaces its failed worker(s) in process"};
  }
  if (recovery_ && recovery_->recovering()) {
    if (formed_everywhere_ && recovery_->complete(running_ranks())) {
      return Observed{Event::kRecovered, false, {}};
    }
    if (recovery_->elapsed() > kRecoveryTimeout) {
      sys::log_line("in-process recovery: generation " + std::to_string(recovery_->generation()) +
                    " not complete after " + sys::seconds_text(kRecoveryTimeout) +
                    ": restarting the worker group");
      return Observed{Event::kWorkerFailed, false, {}};
    }
  }
  if (pctx_->all_exited()) return Observed{Event::kWorkersSucceeded, false, {}};
  return std::nullopt;
}

// A worker of this node failed or hung: its stacks (a hang), the failures, then the round ends
// for every node; the first event of the round wins.
asio::awaitable<Observed> Agent::Impl::worker_failed() {
  set_state(WorkerState::kUnhealthy);
  const bool hung = hangs_ && hangs_->any_found();
  if (hung) co_await hangs_->capture(attempt(), observers_, reported_);
  failures_ = collect_failures(false);
  // A worker that died of a collective's own timeout leaves the others waiting in it: explained
  // as a hang is.
  const bool timed_out = !hung && hangs_ && hangs_->note_collective_timeouts(failures_);
  if (timed_out) co_await hangs_->capture_for_peer(attempt());
  RoundEnd end = co_await rdzv_->report_failure(hung || timed_out);
  if (hung || timed_out) co_await explain_hang();
  Observed seen = observed(end, true);
  if (hung && seen.event == Event::kWorkerFailed) seen.event = Event::kWorkerHung;
  co_return seen;
}

// Another node began a recovery in process that this node cannot follow: the round ends for
// every node, as on a failure here, and the group restarts whole.
asio::awaitable<Observed> Agent::Impl::abandon_recovery(const std::string& why) {
  sys::log_line("in-process recovery: " + peer_recovery_->who +
                " replaces its failed worker(s), but " + why + ": restarting the worker group");
  peer_recovery_.reset();
  set_state(WorkerState::kUnhealthy);
  co_return observed(co_await rdzv_->report_failure(false), false);
}

// A hang, before the workers stop: this node's evidence and every other node's (through the
// rendezvous), judged the same way on every node.
asio::awaitable<void> Agent::Impl::explain_hang() {
  auto mine = co_await hangs_->local_evidence(attempt());
  if (!rdzv_->spans_nodes()) {  // one node: nothing to exchange, nothing to encode
    hangs_->judge(attempt(), mine, observers_);
    co_return;
  }
  auto parts = co_await rdzv_->exchange_hang_evidence(encode_evidence(mine), kHangEvidenceWait);
  std::vector<RankEvidence> all;
  for (const auto& part : parts) {
    for (auto& r : decode_evidence(part)) all.push_back(std::move(r));
  }
  hangs_->judge(attempt(), all, observers_);
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

asio::awaitable<void> Agent::Impl::stop_phase() {
  if (hangs_) hangs_->unwatch();
  standby_.reset();
  if (pctx_) co_await stop_running(signal_.value_or(SIGTERM));
  // Workers that died of our stop signal are no failures of their own, unless they wrote an
  // error file while stopping. Hung workers are, with their stacks.
  if (pctx_) {
    for (auto& f : collect_failures(true)) failures_.push_back(std::move(f));
    if (hangs_) hangs_->add_failures(attempt(), failures_);
  }
  co_await sweep_orphans();
  set_state(WorkerState::kStopped);
}

asio::awaitable<void> Agent::Impl::sweep_orphans() {
  if (!is_subreaper()) co_return;  // the children here are not all the job's (a test, say)
  std::set<pid_t> own;
  if (guardian_) own.insert(guardian_->pid());
  if (warm_) {
    for (pid_t pid : warm_->pids()) own.insert(pid);
  }
  if (standby_) own.insert(standby_->pid());
  for (int rank = 0; pctx_ && rank < static_cast<int>(pctx_->size()); ++rank) {
    if (!pctx_->exit_of(rank)) own.insert(pctx_->pid_of(rank));
  }
  std::vector<std::string> killed =
      co_await agent::sweep_orphans(io_, std::move(own), std::chrono::seconds(1));
  if (killed.empty()) co_return;
  std::string list;
  for (const auto& k : killed) list += (list.empty() ? "" : ", ") + k;
  sys::log_line("killed " + std::to_string(killed.size()) +
                " process(es) the workers left running outside their process groups: " + list);
}

// `sig` to every running worker's process group, --shutdown-timeout grace, SIGKILL, reaped.
// The events that come meanwhile are of the attempt being stopped: only the exits matter.
asio::awaitable<void> Agent::Impl::stop_running(int sig) {
  if (pctx_->all_exited()) co_return;
  pctx_->signal_all(sig);
  // A stopped worker (SIGSTOP, a debugger gone) holds the signal until it runs again.
  if (sig != SIGKILL) pctx_->signal_all(SIGCONT);
  const auto deadline = Clock::now() + spec_.shutdown_timeout;
  while (!pctx_->all_exited() && !escalate_) {
    if (!co_await queue_.pop_until(deadline)) break;
  }
  if (!pctx_->all_exited()) {
    if (!escalate_) {
      sys::log_line(std::to_string(pctx_->running()) + " worker(s) still running " +
                    sys::seconds_text(spec_.shutdown_timeout) + " after " + signal_name(sig) +
                    ": sending SIGKILL");
    }
    pctx_->signal_all(SIGKILL, escalate_
                                   ? "on a second signal to ddprun"
                                   : "after its stop grace of " +
                                         sys::seconds_text(spec_.shutdown_timeout) + " expired");
    while (!pctx_->all_exited()) co_await queue_.pop_until(Clock::time_point::max());
  }
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

AttemptView Agent::Impl::attempt() const {
  return AttemptView{group_, *pctx_, attempt_dir_};
}

std::optional<Clock::time_point> Agent::Impl::exit_deadline() const {
  if (spec_.exit_timeout.count() <= 0 || !first_success_ || pctx_->all_exited()) {
    return std::nullopt;
  }
  return *first_success_ + spec_.exit_timeout;
}

asio::awaitable<void> Agent::Impl::handle_exit_hang() {
  if (hangs_) {
    exit_hung_ = co_await hangs_->capture_exit_hangs(attempt(), observers_);
  } else {
    for (const Worker& w : group_.workers()) {
      if (!pctx_->exit_of(w.local_rank)) exit_hung_.insert(w.local_rank);
    }
  }
  sys::log_line("stopping " + std::to_string(exit_hung_.size()) +
                " worker(s) that did not exit: the work is done, so the attempt counts as "
                "succeeded (a restart would redo it)");
  co_await stop_running(SIGTERM);
}

}  // namespace ddprun::agent
