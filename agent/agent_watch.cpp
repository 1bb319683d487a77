// The agent's watching beyond worker exits: hangs (the watchdog's reports, stack capture),
// exit hangs (--exit-timeout), the health endpoints, the event log and the job summary.
#include <signal.h>
#include <unistd.h>

#include <ctime>

#include "agent/agent_impl.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;

namespace {

std::string worker_name(const Worker& w, pid_t pid) {
  return "rank " + std::to_string(w.global_rank) + " (local rank " + std::to_string(w.local_rank) +
         ", pid " + std::to_string(pid) + ")";
}

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

void log_stacks(const StackDump& dump) {
  sys::log_line("  stacks: " + dump.path + " (" + one_decimal(seconds(dump.took)) + " s)");
  for (const auto& line : dump.head) sys::log_line("    " + line);
  for (const auto& note : dump.notes) sys::log_line("  note: " + note);
}

}  // namespace

std::optional<Observed> Agent::Impl::open_watch() {
  const bool judging =
      spec_.hang_timeout.count() > 0 || spec_.hang_start_timeout.count() > 0 || spec_.file_timer;
  try {
    if (!spec_.event_log.empty()) events_ = EventLog(spec_.event_log, group_.run_id());
    runtime_dir_ = sys::TempDir("ddprun-" + std::to_string(::getpid()) + "-");
    std::string fifo;
    if (spec_.file_timer) {
      fifo = spec_.timer_file.empty() ? runtime_dir_.path() + "/timer.fifo" : spec_.timer_file;
    }
    watchdog_ = std::make_unique<Watchdog>(
        io_, HangOptions{spec_.hang_timeout, spec_.hang_start_timeout},
        runtime_dir_.path() + "/heartbeat.sock", fifo, [this](const Hang& h) { on_hang(h); });
    group_.set_endpoints({watchdog_->heartbeat_path(), watchdog_->timer_fifo_path()});
  } catch (const std::exception& e) {
    if (judging || !spec_.event_log.empty()) {
      return Observed{Event::kStartFailed, false, std::string("error: ") + e.what()};
    }
    sys::log_line(std::string("warning: no heartbeat socket for the workers: ") + e.what());
  }
  if (spec_.health_port) {
    try {
      health_ = std::make_unique<HealthServer>(io_, spec_.health_host, *spec_.health_port,
                                               [this](std::string_view t) { return serve(t); });
    } catch (const std::exception& e) {
      return Observed{Event::kStartFailed, false, std::string("error: ") + e.what()};
    }
    sys::log_line("health endpoints: http://" +
                  sys::endpoint_text(spec_.health_host, health_->port()) +
                  "/healthz, /metrics, /status");
  }
  return std::nullopt;
}

void Agent::Impl::watch_attempt() {
  std::vector<WatchedWorker> watched;
  for (const Worker& w : group_.workers()) {
    const pid_t pid = pctx_->pid_of(w.local_rank);
    watched.push_back({w.local_rank, w.global_rank, pid});
    events_.emit("worker_start", {{"local_rank", w.local_rank},
                                  {"rank", w.global_rank},
                                  {"pid", pid},
                                  {"attempt", group_.round().restart_count}});
  }
  if (watchdog_) watchdog_->watch(std::move(watched));
}

void Agent::Impl::on_worker_exit(int local_rank) {
  if (watchdog_) watchdog_->worker_exited(local_rank);
  const auto& e = pctx_->exit_of(local_rank);
  if (e) {
    nlohmann::json fields = {{"local_rank", local_rank},
                             {"pid", pctx_->pid_of(local_rank)},
                             {"attempt", group_.round().restart_count}};
    if (local_rank < static_cast<int>(group_.workers().size())) {
      fields["rank"] = group_.workers()[local_rank].global_rank;
    }
    switch (e->status.kind) {
      case ExitStatus::Kind::kExited:
        fields["exit_code"] = e->status.value;
        break;
      case ExitStatus::Kind::kSignaled:
        fields["signal"] = signal_name(e->status.value);
        break;
      case ExitStatus::Kind::kExecFailed:
        fields["exec_failed"] = e->status.describe();
        break;
    }
    events_.emit("worker_exit", std::move(fields));
    if (e->status.success() && !first_success_) first_success_ = Clock::now();
  }
  wake_.notify();
}

void Agent::Impl::on_hang(const Hang& hang) {
  const Worker& w = group_.workers().at(hang.local_rank);
  if (group_.state() != WorkerState::kHealthy) return;  // already stopping the group
  if (hang.kind == Hang::Kind::kTimerExpired && hang.signal <= 0) {
    sys::log_line(worker_name(w, hang.pid) + ": " + hang.describe() +
                  "; the client asked for no signal, so it is left running");
    events_.emit("hang", {{"local_rank", w.local_rank},
                          {"rank", w.global_rank},
                          {"pid", hang.pid},
                          {"kind", hang_kind(hang.kind)},
                          {"reason", hang.describe()},
                          {"action", "none"}});
    return;
  }
  if (hang.kind != Hang::Kind::kTimerExpired && first_success_) {
    // Another worker already exited 0: this one may be finishing its part (rank 0 saving a
    // checkpoint). --exit-timeout judges it, not the heartbeat.
    sys::log_line(worker_name(w, hang.pid) + ": " + hang.describe() +
                  " after another worker exited 0: left to --exit-timeout");
    return;
  }
  ++hangs_;
  unhealthy_reason_ = "rank " + std::to_string(w.global_rank) + " hung: " + hang.describe();
  pending_hangs_.push_back(hang);
  wake_.notify();
}

std::string Agent::Impl::stacks_path(int local_rank) const {
  return attempt_dir_ + "/" + std::to_string(local_rank) + "/stacks.txt";
}

asio::awaitable<void> Agent::Impl::capture_hangs() {
  if (watchdog_) watchdog_->unwatch();  // the group is stopping: one report per hang
  while (!pending_hangs_.empty()) {
    const Hang hang = pending_hangs_.front();
    pending_hangs_.erase(pending_hangs_.begin());
    const Worker& w = group_.workers().at(hang.local_rank);
    const int64_t found_at = static_cast<int64_t>(std::time(nullptr));
    sys::log_line(worker_name(w, hang.pid) + " hung: " + hang.describe() +
                  ": capturing its stacks");
    StackDump dump;
    try {
      dump = co_await dump_stacks(io_.get_executor(), hang.pid, stacks_path(hang.local_rank),
                                  spec_.stack_timeout);
    } catch (const std::exception& e) {
      dump.notes.push_back(std::string("no stacks: ") + e.what());
    }
    if (hang.kind == Hang::Kind::kTimerExpired) {
      // torch's FileTimer contract: the scope's signal goes to the process that asked (the
      // watchdog checked it is this worker or in its process group, which is not reaped yet).
      ::kill(hang.pid, hang.signal);
    }
    log_stacks(dump);
    events_.emit("hang", {{"local_rank", w.local_rank},
                          {"rank", w.global_rank},
                          {"pid", hang.pid},
                          {"kind", hang_kind(hang.kind)},
                          {"reason", hang.describe()},
                          {"stacks", dump.path},
                          {"stacks_s", std::chrono::duration<double>(dump.took).count()},
                          {"attempt", group_.round().restart_count}});
    reported_.insert(hang.local_rank);
    hung_.push_back({hang, std::move(dump), found_at});
  }
  co_await capture_silent_peers();
}

// In a collective hang every rank goes silent at about the same moment, and the first one
// reported need not be the culprit: the stacks of the node's other workers that have been
// silent for half the timeout are saved too (not judged: only the reported ones are hung).
asio::awaitable<void> Agent::Impl::capture_silent_peers() {
  if (!watchdog_ || spec_.hang_timeout.count() <= 0) co_return;
  const auto now = Clock::now();
  std::set<int> done;
  for (const auto& h : hung_) done.insert(h.hang.local_rank);
  for (const Worker& w : group_.workers()) {
    if (done.count(w.local_rank) || pctx_->exit_of(w.local_rank)) continue;
    auto beat = watchdog_->last_beat(w.local_rank);
    if (!beat || now - *beat < spec_.hang_timeout / 2) continue;
    const pid_t pid = pctx_->pid_of(w.local_rank);
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - *beat);
    sys::log_line(worker_name(w, pid) + " has been silent for " + sys::seconds_text(silent) +
                  " as well: capturing its stacks");
    try {
      log_stacks(co_await dump_stacks(io_.get_executor(), pid, stacks_path(w.local_rank),
                                      spec_.stack_timeout));
    } catch (const std::exception& e) {
      sys::log_line(std::string("  no stacks: ") + e.what());
    }
  }
}

void Agent::Impl::add_hang_failures() {
  for (const HungWorker& h : hung_) {
    const int local_rank = h.hang.local_rank;
    const Worker& w = group_.workers().at(local_rank);
    const auto& e = pctx_->exit_of(local_rank);
    ProcessFailure f = make_failure(local_rank, w.global_rank, pctx_->pid_of(local_rank),
                                    e ? e->status : ExitStatus::signaled(SIGKILL),
                                    pctx_->launch_of(local_rank).error_file, h.unix_time, 0);
    f.timestamp = h.unix_time;  // found hung then, whatever its error file says later
    f.hang = h.hang.describe();
    f.stacks_path = h.stacks.path;
    f.stack_head = h.stacks.head;
    failures_.push_back(std::move(f));
  }
}

std::optional<Clock::time_point> Agent::Impl::exit_deadline() const {
  if (spec_.exit_timeout.count() <= 0 || !first_success_ || pctx_->all_exited()) {
    return std::nullopt;
  }
  return *first_success_ + spec_.exit_timeout;
}

asio::awaitable<void> Agent::Impl::handle_exit_hang() {
  std::vector<int> running;
  for (const Worker& w : group_.workers()) {
    if (!pctx_->exit_of(w.local_rank)) running.push_back(w.local_rank);
  }
  if (watchdog_) watchdog_->unwatch();
  for (int local_rank : running) {
    const Worker& w = group_.workers().at(local_rank);
    const pid_t pid = pctx_->pid_of(local_rank);
    const std::string why = "has not exited " + sys::seconds_text(spec_.exit_timeout) +
                            " after another worker of this node exited 0";
    sys::log_line(worker_name(w, pid) + " " + why + ": capturing its stacks");
    StackDump dump;
    try {
      dump = co_await dump_stacks(io_.get_executor(), pid, stacks_path(local_rank),
                                  spec_.stack_timeout);
    } catch (const std::exception& e) {
      dump.notes.push_back(std::string("no stacks: ") + e.what());
    }
    log_stacks(dump);
    events_.emit("exit_hang", {{"local_rank", local_rank},
                               {"rank", w.global_rank},
                               {"pid", pid},
                               {"reason", why},
                               {"stacks", dump.path},
                               {"attempt", group_.round().restart_count}});
    exit_hung_.insert(local_rank);
  }
  sys::log_line("stopping " + std::to_string(running.size()) +
                " worker(s) that did not exit: the work is done, so the attempt counts as "
                "succeeded (a restart would redo it)");
  co_await stop_running(SIGTERM);
}

}  // namespace ddprun::agent
