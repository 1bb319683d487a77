// The agent loop's in-process recovery (--in-process-recovery, in_process_recovery.hpp): a
// failed worker replaced alone while the others keep running, and the end of that recovery.
#include <cstdio>

#include "agent/agent_impl.hpp"
#include "store/sys/log.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// `name`=`value` in `env`, replacing what was there.
void set_env(std::vector<std::string>& env, const std::string& name, const std::string& value) {
  const std::string prefix = name + "=";
  for (auto& kv : env) {
    if (kv.compare(0, prefix.size(), prefix) == 0) {
      kv = prefix + value;
      return;
    }
  }
  env.push_back(prefix + value);
}

}  // namespace

std::vector<int> Agent::Impl::running_ranks() const {
  std::vector<int> ranks;
  for (const Worker& w : group_.workers()) {
    if (!pctx_->exit_of(w.local_rank)) ranks.push_back(w.global_rank);
  }
  return ranks;
}

// A healthy group whose failed workers all died (none hung, none exited 0) while every other
// one (of every node) runs a TrainingLoop of the current generation: those can rebuild their
// process group with a replacement. Anything else restarts the group as before.
asio::awaitable<std::optional<Observed>> Agent::Impl::replaceable() {
  if (!recovery_ || group_.state() != WorkerState::kHealthy) co_return std::nullopt;
  if (hangs_ && hangs_->any_found()) co_return std::nullopt;
  std::vector<int> failed;
  for (const Worker& w : group_.workers()) {
    const auto& e = pctx_->exit_of(w.local_rank);
    if (!e) continue;
    if (e->status.success()) co_return std::nullopt;  // the job is ending: nothing to recover
    failed.push_back(w.global_rank);
  }
  const std::vector<int> running = running_ranks();
  // Across nodes, the survivors may all be elsewhere.
  const bool spans = rdzv_->spans_nodes();
  if (failed.empty() || (running.empty() && !spans)) co_return std::nullopt;
  if (!recovery_->ready(running)) {
    sys::log_line(
        "in-process recovery: not every other worker runs a ddprun::TrainingLoop of "
        "process group generation " +
        std::to_string(recovery_->generation()) + ": restarting the worker group");
    co_return std::nullopt;
  }
  const auto granted = co_await rdzv_->restart_in_place(recovery_->generation());
  if (!granted.restart_count) {
    // No restart left: the failure path says so.
    if (!granted.refused.empty()) {
      sys::log_line("in-process recovery: " + granted.refused + ": restarting the worker group");
    }
    co_return std::nullopt;
  }
  failures_ = collect_failures(false);  // logged as the attempt's, before the count moves on
  group_.set_restart_count(*granted.restart_count);
  std::string others = running.empty() ? "the other nodes' workers keep running"
                                       : "rank(s) " + rank_list(running) + " keep running";
  if (!running.empty() && spans) others += ", with the other nodes' workers";
  co_return Observed{Event::kWorkerReplaceable, true,
                     "rank(s) " + rank_list(failed) + " failed; " + others};
}

// Across nodes, once per change: this node counts itself in the generation its workers all run
// a loop of (or out of it, when one leaves its loop or exits 0; a worker that died changes
// nothing: its failure is judged), and while a recovery runs, asks whether every node's workers
// run the new generation.
asio::awaitable<void> Agent::Impl::share_generation() {
  if (!recovery_ || !rdzv_->spans_nodes()) co_return;
  const int generation = recovery_->generation();
  bool died = false;
  bool finished = false;
  for (const Worker& w : group_.workers()) {
    if (const auto& e = pctx_->exit_of(w.local_rank))
      (e->status.success() ? finished : died) = true;
  }
  const bool joined =
      !finished && (died ? shared_generation_ == generation : recovery_->ready(running_ranks()));
  if (joined && shared_generation_ != generation) {
    co_await rdzv_->share_generation(generation, true);
    shared_generation_ = generation;
  } else if (!joined && shared_generation_ == generation) {
    co_await rdzv_->share_generation(generation, false);
    shared_generation_.reset();
  }
  formed_everywhere_ =
      !recovery_->recovering() || (joined && co_await rdzv_->generation_formed(generation));
}

// Why this node's workers cannot rebuild with another node's replacement, if they cannot.
std::optional<std::string> Agent::Impl::cannot_follow() const {
  if (group_.state() != WorkerState::kHealthy) {
    return "generation " + std::to_string(recovery_->generation()) + " had not formed yet";
  }
  const std::vector<int> running = running_ranks();
  if (running.size() != group_.workers().size() || !recovery_->ready(running)) {
    return "not every worker of this node runs a ddprun::TrainingLoop of process group "
           "generation " +
           std::to_string(recovery_->generation());
  }
  return std::nullopt;
}

void Agent::Impl::follow_peer() {
  recovery_->follow(peer_recovery_->generation);
  sys::log_line("in-process recovery: " + peer_recovery_->who +
                " replaces its failed worker(s); this node's workers rebuild their process "
                "group to generation " +
                std::to_string(peer_recovery_->generation));
}

void Agent::Impl::replace_failed() {
  std::vector<int> failed_local, failed_ranks;
  for (const Worker& w : group_.workers()) {
    if (pctx_->exit_of(w.local_rank)) {
      failed_local.push_back(w.local_rank);
      failed_ranks.push_back(w.global_rank);
    }
  }
  const int generation = recovery_->begin(failed_ranks);
  const RendezvousInfo& round = group_.round();
  for (int local_rank : failed_local) {
    const pid_t old_pid = pctx_->pid_of(local_rank);
    WorkerLaunch launch = pctx_->launch_of(local_rank);
    // The attempt's own variables stay (TORCHELASTIC_RESTART_COUNT among them: torch 1.13's
    // store keys carry it, and the replacement meets the others under the attempt's keys).
    set_env(launch.env, "DDPRUN_RECOVERY_GENERATION", std::to_string(generation));
    launch.out.append = launch.err.append = true;  // after the dead worker's output
    std::remove(launch.error_file.c_str());        // collected above; the new one is its own
    ProcessContext::WarmSpawn standby;
    if (standby_ && !standby_->taken() && standby_->argv() == launch.argv) {
      standby = [this](const WorkerLaunch& l, int out, int err) {
        return standby_->take(l.env, out, err);
      };
    }
    const bool had_standby = static_cast<bool>(standby);
    try {
      pctx_->respawn(local_rank, spec_.program, std::move(launch), reset_signals_, standby);
    } catch (const std::exception& e) {
      // The worker stays failed: the loop's next look at the group restarts it whole.
      sys::log_line("in-process recovery: cannot start rank " +
                    std::to_string(group_.workers()[static_cast<size_t>(local_rank)].global_rank) +
                    " again (" + e.what() + "): restarting the worker group");
      continue;
    }
    const bool from_standby = had_standby && standby_->taken();
    reported_.erase(local_rank);
    const Worker& w = group_.workers()[static_cast<size_t>(local_rank)];
    const StartedWorker started{local_rank, w.global_rank, pctx_->pid_of(local_rank)};
    sys::log_line("in-process recovery: rank " + std::to_string(w.global_rank) + " (pid " +
                  std::to_string(old_pid) + ") replaced by pid " + std::to_string(started.pid) +
                  (from_standby ? " (the standby)" : " (started cold)") +
                  " to join process group generation " + std::to_string(generation) +
                  "; the other workers keep running");
    observers_.each([&](AgentObserver& o) { o.on_worker_replaced(round, started, generation); });
  }
  if (hangs_) {
    std::vector<WatchedWorker> watched;
    for (const Worker& w : group_.workers()) {
      watched.push_back({w.local_rank, w.global_rank, pctx_->pid_of(w.local_rank)});
    }
    hangs_->watch(std::move(watched));
  }
}

void Agent::Impl::recovery_done() {
  sys::log_line("in-process recovery: process group generation " +
                std::to_string(recovery_->generation()) + " formed in " +
                std::to_string(recovery_->elapsed().count()) + " ms; every rank trains again");
  failures_.clear();  // recovered from: not this attempt's failure any more
  if (standby_ && standby_->taken()) standby_.reset();
  if (spec_.recovery_standby && !spec_.python) standby_due_ = Clock::now();
  prepare_standby();
}

// The spare worker of a binary entrypoint (process/standby.hpp), with the first worker's
// argument list: a worker whose own differs (${local_rank} in the arguments) starts cold.
void Agent::Impl::prepare_standby() {
  if (!standby_due_ || !recovery_ || recovery_->recovering() || standby_) return;
  if (Clock::now() - *standby_due_ > kStandbyWait) {
    standby_due_.reset();  // the workers never announced a loop: no standby for them
    return;
  }
  if (group_.workers().empty() || !recovery_->ready(running_ranks())) return;
  if (running_ranks().size() != group_.workers().size()) return;  // one has exited
  standby_due_.reset();
  const WorkerLaunch& first = pctx_->launch_of(group_.workers().front().local_rank);
  try {
    standby_ =
        std::make_unique<Standby>(spec_.program, first.argv, first.env, reset_signals_, guardian_);
  } catch (const std::exception& e) {
    sys::log_line(std::string("in-process recovery: no standby worker (replacements start "
                              "cold): ") +
                  e.what());
  }
}

}  // namespace ddprun::agent
