// Agent::Impl, the agent's private parts, shared by agent.cpp (the loop and its phases) and
// agent_watch.cpp (hangs, exit hangs, the health endpoints, events and the job summary).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/agent.hpp"
#include "agent/event_log.hpp"
#include "agent/failure.hpp"
#include "agent/hang/watchdog.hpp"
#include "agent/health/http_server.hpp"
#include "agent/job_status.hpp"
#include "agent/process/log_dir.hpp"
#include "agent/process/stack_dump.hpp"
#include "agent/state_machine.hpp"
#include "agent/worker_group.hpp"
#include "agent/worker_launch.hpp"
#include "store/sys/temp_dir.hpp"
#include "store/sys/wakeup.hpp"

namespace ddprun::agent {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// "4.6" (seconds in log lines).
inline std::string one_decimal(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", value);
  return buf;
}

// What ended a phase: the event for the state machine, with the handler's answer on restarts.
struct Observed {
  Event event;
  bool restart_allowed = false;
  std::string what;  // for the log: which node, which error
};

// A worker found hung this attempt, with its stacks.
struct HungWorker {
  Hang hang;
  StackDump stacks;
  int64_t unix_time = 0;  // when it was found
};

class Agent::Impl {
 public:
  Impl(boost::asio::io_context& io, WorkerSpec spec, std::unique_ptr<RendezvousHandler> rdzv,
       Guardian* guardian);

  JobResult run();

 private:
  boost::asio::awaitable<JobResult> loop();
  // Phases. Each returns the event that ended it, or nothing when it completed.
  boost::asio::awaitable<std::optional<Observed>> rendezvous_phase();
  std::optional<Observed> start_phase();
  boost::asio::awaitable<Observed> monitor_phase();
  boost::asio::awaitable<Observed> exit_barrier_phase();
  boost::asio::awaitable<void> stop_phase();
  boost::asio::awaitable<void> stop_running(int sig);
  boost::asio::awaitable<JobResult> leave(const Decision& d, const Observed& seen);
  JobResult result_of(const Decision& d, const Observed& seen, bool from_init) const;

  void transition(const Decision& d, const Observed& seen);
  std::vector<ProcessFailure> collect_failures(bool only_with_error_file);
  void log_started();
  bool any_failed() const;
  void arm_signals();
  void on_signal(int sig);
  void on_worker_exit(int local_rank);

  // agent_watch.cpp: what watches the workers besides their exits, and what a person sees.
  std::optional<Observed> open_watch();  // runtime dir, watchdog, health server, event log
  void watch_attempt();                  // the new attempt's workers, to the watchdog
  void on_hang(const Hang& hang);
  boost::asio::awaitable<void> capture_hangs();  // stacks, the timer's signal, log lines
  boost::asio::awaitable<void> capture_silent_peers();
  void add_hang_failures();  // after the stop: hung workers as failures
  std::optional<Clock::time_point> exit_deadline() const;
  boost::asio::awaitable<void> handle_exit_hang();
  JobStatus snapshot() const;
  HttpResponse serve(std::string_view target) const;
  void emit_transition(const Decision& d, const Observed& seen);
  void emit_round(std::chrono::milliseconds took);
  void emit_job_end(const JobResult& result);
  std::string stacks_path(int local_rank) const;

  boost::asio::io_context& io_;
  WorkerSpec spec_;
  std::unique_ptr<RendezvousHandler> rdzv_;
  Guardian* guardian_;
  WorkerGroup group_;
  sys::Wakeup wake_;
  boost::asio::signal_set signals_;
  std::vector<int> reset_signals_;
  std::optional<RunLogDir> logs_;
  std::string attempt_dir_;
  bool keep_logs_ = true;
  std::unique_ptr<ProcessContext> pctx_;
  FilteredFiles filtered_;
  Clock::time_point agent_started_ = Clock::now();
  Clock::time_point started_;
  std::optional<Clock::time_point> first_success_;  // a worker of this attempt exited 0
  std::optional<int> signal_;
  bool escalate_ = false;                 // a second signal: SIGKILL without the grace
  bool in_rendezvous_ = false;            // a signal must interrupt the handler's waits
  std::set<int> reported_;                // local ranks whose failure was collected this attempt
  std::vector<ProcessFailure> failures_;  // of the attempt that just ended

  // Watching (agent_watch.cpp).
  sys::TempDir runtime_dir_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<HealthServer> health_;
  EventLog events_;
  std::vector<Hang> pending_hangs_;  // reported by the watchdog, not handled yet
  std::vector<HungWorker> hung_;     // this attempt's
  std::set<int> exit_hung_;          // local ranks stopped after --exit-timeout
  std::string unhealthy_reason_;     // /healthz, while the group is not healthy
  std::chrono::milliseconds round_took_{0};
  uint64_t attempts_ = 0;
  uint64_t reformations_ = 0;
  uint64_t hangs_ = 0;
};

}  // namespace ddprun::agent
