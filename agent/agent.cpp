#include "agent/agent.hpp"

#include <signal.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <map>
#include <optional>
#include <set>

#include "agent/failure.hpp"
#include "agent/process/guardian.hpp"
#include "store/sys/log.hpp"
#include "agent/process/log_dir.hpp"
#include "agent/process/process_context.hpp"
#include "agent/template.hpp"
#include "agent/wakeup.hpp"
#include "agent/worker_env.hpp"
#include "agent/worker_group.hpp"
#include "store/sys/fd.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

class Agent::Impl {
 public:
  Impl(asio::io_context& io, WorkerSpec spec, std::unique_ptr<RendezvousHandler> rdzv,
       Guardian* guardian)
      : io_(io),
        spec_(std::move(spec)),
        rdzv_(std::move(rdzv)),
        guardian_(guardian),
        group_(spec_),
        wake_(io.get_executor()),
        signals_(io) {
    reset_signals_ = spec_.signals_to_handle;
    reset_signals_.push_back(SIGPIPE);
  }

  int run() {
    for (int sig : spec_.signals_to_handle) signals_.add(sig);
    arm_signals();
    int result = 1;
    asio::co_spawn(io_, loop(), [&](std::exception_ptr error, int code) {
      result = code;
      if (error) {
        result = 1;
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          sys::log_line(std::string("error: ") + e.what());
        }
      }
      io_.stop();
    });
    io_.run();
    signals_.clear();
    pctx_.reset();  // kills and reaps anything left (only on internal errors)
    return result;
  }

 private:
  asio::awaitable<int> loop();
  asio::awaitable<void> stop_group(int sig);
  asio::awaitable<int> stop_for_signal(std::vector<ProcessFailure> failures);
  std::vector<WorkerLaunch> make_launches(const std::string& attempt_dir);
  StreamTarget stream_target(int local_rank, Std which, int console_fd, const std::string& rank_dir,
                             const std::string& attempt_dir);
  std::vector<ProcessFailure> collect_failures(bool only_with_error_file);
  void log_started(const RendezvousInfo& info, const RunLogDir& logs);

  void arm_signals() {
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      on_signal(sig);
      arm_signals();
    });
  }

  void on_signal(int sig) {
    if (!signal_) {
      signal_ = sig;
      size_t running = pctx_ ? pctx_->running() : 0;
      sys::log_line("received " + signal_name(sig) + ": forwarding it to " + std::to_string(running) +
               " running worker(s), SIGKILL after " + sys::seconds_text(spec_.shutdown_timeout) +
               " (a second signal kills them now)");
      if (stopping_ && pctx_) pctx_->signal_all(sig);
      if (in_rendezvous_) rdzv_->interrupt();
    } else {
      escalate_ = true;
      sys::log_line("received " + signal_name(sig) + " again: killing the workers now");
    }
    wake_.notify();
  }

  bool any_failed() const {
    for (size_t r = 0; r < pctx_->size(); ++r) {
      const auto& e = pctx_->exit_of(static_cast<int>(r));
      if (e && e->exitcode != 0) return true;
    }
    return false;
  }

  asio::io_context& io_;
  WorkerSpec spec_;
  std::unique_ptr<RendezvousHandler> rdzv_;
  Guardian* guardian_;
  WorkerGroup group_;
  Wakeup wake_;
  asio::signal_set signals_;
  std::vector<int> reset_signals_;
  std::unique_ptr<ProcessContext> pctx_;
  std::optional<int> signal_;
  bool escalate_ = false;
  bool stopping_ = false;
  bool in_rendezvous_ = false;  // waiting in next_rendezvous or the exit barrier
  std::set<int> reported_;      // local ranks whose failure was already collected this attempt
  std::shared_ptr<sys::UniqueFd> filtered_stdout_;  // this attempt's filtered_stdout.log
  std::shared_ptr<sys::UniqueFd> filtered_stderr_;
};

asio::awaitable<int> Agent::Impl::loop() {
  std::optional<RunLogDir> logs;
  try {
    logs.emplace(spec_.log_dir, rdzv_->run_id());
  } catch (const std::exception& e) {
    sys::log_line(std::string("error: ") + e.what());
    co_return 1;
  }
  const bool keep_logs = !logs->temporary() || spec_.redirects.is_map() || spec_.tee.is_map() ||
                         spec_.redirects.for_rank(0) != Std::kNone ||
                         spec_.tee.for_rank(0) != Std::kNone;
  rdzv_->on_round_end([this] { wake_.notify(); });
  for (;;) {
    RendezvousInfo info;
    std::optional<RendezvousError> rdzv_error;
    try {
      in_rendezvous_ = true;
      info = co_await rdzv_->next_rendezvous(group_.restart_count, spec_.local_world_size);
    } catch (const RendezvousError& e) {
      rdzv_error = e;
    }
    in_rendezvous_ = false;
    if (rdzv_error) {
      co_await rdzv_->shutdown(RendezvousHandler::Exit::kLeaving);
      if (signal_) co_return 128 + *signal_;
      if (rdzv_error->exit_code() == 0) {
        sys::log_line(rdzv_error->what());
        if (!keep_logs) logs->remove_temporary();
      } else {
        sys::log_line(std::string("error: ") + rdzv_error->what());
      }
      co_return rdzv_error->exit_code();
    }
    if (signal_) {
      co_await rdzv_->shutdown(RendezvousHandler::Exit::kLeaving);
      co_return 128 + *signal_;
    }
    group_.restart_count = info.restart_count;
    if (info.max_restarts >= 0) group_.max_restarts = info.max_restarts;
    group_.group_rank = info.group_rank;
    group_.group_world_size = info.group_world_size;
    group_.master_addr = info.master_addr;
    group_.master_port = info.master_port;
    group_.use_agent_store = info.use_agent_store;
    group_.run_id = rdzv_->run_id();
    group_.assign_ranks(info.base_global_rank, info.world_size);

    std::string attempt_dir;
    bool started_ok = false;
    try {
      attempt_dir = logs->make_attempt(group_.restart_count, spec_.local_world_size);
      reported_.clear();
      pctx_ = std::make_unique<ProcessContext>(io_, guardian_, [this](int) { wake_.notify(); });
      pctx_->start(spec_.program, make_launches(attempt_dir), reset_signals_);
      started_ok = true;
    } catch (const std::exception& e) {
      sys::log_line(std::string("error: cannot start the workers: ") + e.what());
      pctx_.reset();
    }
    if (!started_ok) {
      co_await rdzv_->shutdown(RendezvousHandler::Exit::kLeaving);
      co_return 1;
    }
    group_.set_state(WorkerState::kHealthy);
    log_started(info, *logs);
    const auto started = Clock::now();

    while (!signal_ && !any_failed() && !pctx_->all_exited() && !rdzv_->round_end()) {
      co_await wake_.wait();
    }

    if (signal_) co_return co_await stop_for_signal({});

    std::vector<ProcessFailure> failures;
    RoundEnd end;
    if (auto ended = rdzv_->round_end()) {
      // Another node (or the store) ended the round while our workers ran.
      end = *ended;
      sys::log_line("round " + std::to_string(info.round) + ": " + end.what + ": stopping " +
               std::to_string(pctx_->running()) + " running worker(s)");
      failures = collect_failures(false);
      co_await stop_group(SIGTERM);
      for (auto& f : collect_failures(true)) failures.push_back(std::move(f));
      group_.set_state(WorkerState::kStopped);
    } else if (!any_failed()) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
      in_rendezvous_ = true;
      end = co_await rdzv_->report_success();  // the exit barrier (multi-node)
      in_rendezvous_ = false;
      if (signal_) co_return co_await stop_for_signal({});
      if (end.kind == RoundEnd::Kind::kSucceeded) {
        group_.set_state(WorkerState::kSucceeded);
        co_await rdzv_->shutdown(RendezvousHandler::Exit::kSucceeded);
        sys::log_line("attempt " + std::to_string(group_.restart_count) + ": all " +
                 std::to_string(spec_.local_world_size) + " workers exited 0 (" +
                 std::to_string(ms.count()) + " ms)");
        if (!keep_logs) logs->remove_temporary();
        co_return 0;
      }
      // Another node failed, left or arrived before every node finished: run again with them.
      sys::log_line("round " + std::to_string(info.round) + ": this node's workers exited 0, but " +
               end.what + " before every node finished");
      group_.set_state(WorkerState::kStopped);
    } else {
      group_.set_state(WorkerState::kUnhealthy);
      failures = collect_failures(false);
      end = co_await rdzv_->report_failure();
      co_await stop_group(SIGTERM);
      for (auto& f : collect_failures(true)) failures.push_back(std::move(f));
      group_.set_state(WorkerState::kStopped);
    }
    if (signal_) co_return co_await stop_for_signal(failures);

    switch (end.kind) {
      case RoundEnd::Kind::kStoreLost:
        group_.set_state(WorkerState::kFailed);
        co_await rdzv_->shutdown(RendezvousHandler::Exit::kLeaving);
        sys::log_line("error: " + end.what + "; workers stopped, exiting with 1");
        co_return 1;
      case RoundEnd::Kind::kNodeJoined:
      case RoundEnd::Kind::kNodeLost:
        group_.set_state(WorkerState::kInit);
        sys::log_line("re-forming the worker group without spending a restart (restart count stays " +
                 std::to_string(group_.restart_count) + ")");
        continue;
      case RoundEnd::Kind::kSucceeded:  // only from report_success, handled above
      case RoundEnd::Kind::kWorkerFailed:
        break;
    }
    if (group_.restart_count < group_.max_restarts) {
      ++group_.restart_count;
      group_.set_state(WorkerState::kInit);
      sys::log_line("restarting the worker group: attempt " + std::to_string(group_.restart_count) +
               " (" + std::to_string(group_.restart_count) + " of " +
               std::to_string(group_.max_restarts) + " restarts used)");
      continue;
    }
    group_.set_state(WorkerState::kFailed);
    co_await rdzv_->shutdown(RendezvousHandler::Exit::kFailed);
    if (failures.empty()) {
      sys::log_line("job failed: " + end.what + " and no restarts are left (" +
               std::to_string(group_.restart_count) + " of " + std::to_string(group_.max_restarts) +
               " used); exiting with 1");
      co_return 1;
    }
    const ProcessFailure& root = root_cause(failures);
    std::string summary =
        "\n" + format_failure_summary(spec_.entrypoint_name, failures, sys::host_name());
    sys::write_all(STDERR_FILENO, summary.data(), summary.size());
    int code = exit_code_for(root);
    sys::log_line("job failed after " + std::to_string(group_.restart_count) +
             " restart(s); exiting with the root cause's exit code " + std::to_string(code));
    co_return code;
  }
}

asio::awaitable<int> Agent::Impl::stop_for_signal(std::vector<ProcessFailure> failures) {
  if (pctx_ && !pctx_->all_exited()) {
    co_await stop_group(*signal_);
    for (auto& f : collect_failures(true)) failures.push_back(std::move(f));
  }
  if (group_.state() == WorkerState::kHealthy || group_.state() == WorkerState::kUnhealthy) {
    group_.set_state(WorkerState::kStopped);
  }
  co_await rdzv_->shutdown(RendezvousHandler::Exit::kLeaving);
  if (!failures.empty()) {
    std::string summary =
        "\n" + format_failure_summary(spec_.entrypoint_name, failures, sys::host_name());
    sys::write_all(STDERR_FILENO, summary.data(), summary.size());
  }
  sys::log_line("workers stopped after " + signal_name(*signal_) + "; exiting with " +
           std::to_string(128 + *signal_));
  co_return 128 + *signal_;
}

asio::awaitable<void> Agent::Impl::stop_group(int sig) {
  stopping_ = true;
  pctx_->signal_all(sig);
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
  stopping_ = false;
}

std::vector<ProcessFailure> Agent::Impl::collect_failures(bool only_with_error_file) {
  std::vector<ProcessFailure> out;
  for (const Worker& w : group_.workers) {
    const auto& e = pctx_->exit_of(w.local_rank);
    if (!e || e->exitcode == 0 || reported_.count(w.local_rank)) continue;
    const WorkerLaunch& launch = pctx_->launch_of(w.local_rank);
    ProcessFailure f = make_failure(w.local_rank, w.global_rank, pctx_->pid_of(w.local_rank),
                                    e->exitcode, launch.error_file, e->unix_time, e->sequence);
    // Workers that died of our own stop signal are not failures of their own.
    if (only_with_error_file && f.error_file == "<N/A>") continue;
    reported_.insert(w.local_rank);
    std::string what = f.exitcode < 0 ? "was killed by " + signal_name(-f.exitcode) +
                                            " (exitcode " + std::to_string(f.exitcode) + ")"
                                      : "failed with exitcode " + std::to_string(f.exitcode);
    std::string detail = f.error_file != "<N/A>" ? ": " + f.message : "";
    sys::log_line("attempt " + std::to_string(group_.restart_count) + ": worker " +
             std::to_string(w.local_rank) + " (rank " + std::to_string(w.global_rank) + ", pid " +
             std::to_string(f.pid) + ") " + what + detail);
    out.push_back(std::move(f));
  }
  return out;
}

StreamTarget Agent::Impl::stream_target(int local_rank, Std which, int console_fd,
                                        const std::string& rank_dir,
                                        const std::string& attempt_dir) {
  StreamTarget t;
  const bool shown = !spec_.local_ranks_filter || spec_.local_ranks_filter->count(local_rank) != 0;
  const bool tee = has(spec_.tee.for_rank(local_rank), which);
  const bool redirect = tee || has(spec_.redirects.for_rank(local_rank), which);
  const auto& filters =
      which == Std::kOut ? spec_.duplicate_stdout_filters : spec_.duplicate_stderr_filters;
  const char* name = which == Std::kOut ? "stdout" : "stderr";
  if (!redirect) {
    t.kind = shown ? StreamTarget::Kind::kInherit : StreamTarget::Kind::kDevNull;
    return t;
  }
  t.path = rank_dir + "/" + name + ".log";
  if (!tee || (!shown && filters.empty())) {
    t.kind = StreamTarget::Kind::kFile;
    return t;
  }
  t.kind = StreamTarget::Kind::kTee;
  t.console_fd = shown ? console_fd : -1;
  const std::string& templ = spec_.log_line_prefix_template.empty()
                                 ? std::string("[${role_name}${local_rank}]:")
                                 : spec_.log_line_prefix_template;
  t.prefix = safe_substitute(
      templ, {{"role_name", spec_.role},
              {"local_rank", std::to_string(local_rank)},
              {"rank", std::to_string(group_.workers[static_cast<size_t>(local_rank)].global_rank)},
              {"hostname", sys::host_name()}});
  if (!filters.empty()) {
    auto& shared = which == Std::kOut ? filtered_stdout_ : filtered_stderr_;
    if (!shared) {
      shared = std::make_shared<sys::UniqueFd>(
          sys::open_for_write((attempt_dir + "/filtered_" + name + ".log").c_str()));
    }
    t.filtered_file = shared;
    t.filters = filters;
  }
  return t;
}

std::vector<WorkerLaunch> Agent::Impl::make_launches(const std::string& attempt_dir) {
  filtered_stdout_.reset();
  filtered_stderr_.reset();
  std::vector<WorkerLaunch> launches;
  for (const Worker& w : group_.workers) {
    WorkerLaunch l;
    l.local_rank = w.local_rank;
    l.global_rank = w.global_rank;
    const std::string rank_dir = attempt_dir + "/" + std::to_string(w.local_rank);
    l.error_file = rank_dir + "/error.json";
    l.env = build_worker_env(group_, w, l.error_file);
    const std::map<std::string, std::string> macros{{"local_rank", std::to_string(w.local_rank)}};
    l.argv.push_back(spec_.argv0);
    for (const auto& arg : spec_.args) l.argv.push_back(safe_substitute(arg, macros));
    l.out = stream_target(w.local_rank, Std::kOut, STDOUT_FILENO, rank_dir, attempt_dir);
    l.err = stream_target(w.local_rank, Std::kErr, STDERR_FILENO, rank_dir, attempt_dir);
    launches.push_back(std::move(l));
  }
  return launches;
}

void Agent::Impl::log_started(const RendezvousInfo& info, const RunLogDir& logs) {
  const auto& ws = group_.workers;
  std::string ranks = ws.empty() ? "-"
                                 : std::to_string(ws.front().global_rank) + "-" +
                                       std::to_string(ws.back().global_rank);
  sys::log_line("attempt " + std::to_string(group_.restart_count) + ": started " +
           std::to_string(ws.size()) + " worker(s) (world size " + std::to_string(info.world_size) +
           ", ranks " + ranks + ", store " + info.store_host + ":" +
           std::to_string(info.store_port) + ", run id " + group_.run_id + ", max restarts " +
           std::to_string(group_.max_restarts) + ", logs " + logs.path() + ")");
}

Agent::Agent(asio::io_context& io, WorkerSpec spec, std::unique_ptr<RendezvousHandler> rdzv,
             Guardian* guardian)
    : impl_(std::make_unique<Impl>(io, std::move(spec), std::move(rdzv), guardian)) {}

Agent::~Agent() = default;

int Agent::run() {
  return impl_->run();
}

}  // namespace ddprun::agent
