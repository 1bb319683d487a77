// Agent::Impl: the agent's core loop, and the parts it is made of.
//
//   core (this class, agent.cpp, agent_phases.cpp)  the worker group, the state machine's
//       decisions, the phases (rendezvous, start, monitor, exit barrier, stop) and the running
//       attempt's processes and failures
//   event sources -> EventQueue (agent_event.hpp)    worker exits, round ends, signals, hangs
//   HangMonitor (hang_monitor.hpp)                    finds hung workers, takes their stacks
//   observers (agent_observer.hpp)                    JobSummary (the counts and the summary
//       line), EventLogObserver (--event-log), StatusObserver (the health endpoints)
//
// A new capability is a new source feeding the queue one typed event, or a new observer; the
// core keeps only what its decisions need.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/agent.hpp"
#include "agent/agent_event.hpp"
#include "agent/agent_observer.hpp"
#include "agent/checkpoint_replicas.hpp"
#include "agent/event_log_observer.hpp"
#include "agent/failure.hpp"
#include "agent/hang_monitor.hpp"
#include "agent/in_process_recovery.hpp"
#include "agent/job_summary.hpp"
#include "agent/memory_checkpoints.hpp"
#include "agent/process/kill_cause.hpp"
#include "agent/process/log_dir.hpp"
#include "agent/process/standby.hpp"
#include "agent/state_machine.hpp"
#include "agent/status_observer.hpp"
#include "agent/warm_start.hpp"
#include "agent/worker_group.hpp"
#include "agent/worker_launch.hpp"

namespace ddprun::agent {

using Clock = std::chrono::steady_clock;

class Agent::Impl {
 public:
  Impl(boost::asio::io_context& io, WorkerSpec spec, std::unique_ptr<RendezvousHandler> rdzv,
       Guardian* guardian);

  JobResult run();

 private:
  boost::asio::awaitable<JobResult> loop();

  // Phases (agent_phases.cpp). Each returns the event that ended it, or nothing when it
  // completed.
  boost::asio::awaitable<std::optional<Observed>> rendezvous_phase();
  std::optional<Observed> start_phase();
  boost::asio::awaitable<Observed> monitor_phase();
  boost::asio::awaitable<Observed> exit_barrier_phase();
  boost::asio::awaitable<void> stop_phase();
  // Kills what the workers left outside their process groups (process/orphan_sweep.hpp).
  boost::asio::awaitable<void> sweep_orphans();
  boost::asio::awaitable<void> stop_running(int sig);
  boost::asio::awaitable<JobResult> leave(const Decision& d, const Observed& seen);
  JobResult result_of(const Decision& d, const Observed& seen, bool from_init) const;

  // What ends the running attempt now, or nothing (the monitor phase asks after each event).
  std::optional<Observed> judge();
  boost::asio::awaitable<Observed> worker_failed();
  // In-process recovery (in_process_recovery.hpp): whether this node's failed workers can be
  // replaced alone (then a restart is spent); the replacement; its end.
  boost::asio::awaitable<std::optional<Observed>> replaceable();
  void replace_failed();
  void recovery_done();
  // Across nodes: what this node tells the others of its workers' generation (and, while a
  // recovery runs, whether every node's workers run the new one); following another node's
  // recovery, or ending the round when this node cannot.
  boost::asio::awaitable<void> share_generation();
  std::optional<std::string> cannot_follow() const;
  boost::asio::awaitable<Observed> abandon_recovery(const std::string& why);
  void follow_peer();
  // The standby starts once every worker has announced a TrainingLoop: only then is the
  // program known to wait for a rank in init_process_group() (any other program would run as
  // one more rank 0). Looked for every kStandbyPoll, for at most kStandbyWait after a start.
  void prepare_standby();
  static constexpr std::chrono::milliseconds kStandbyPoll{100};
  static constexpr std::chrono::seconds kStandbyWait{300};
  std::vector<int> running_ranks() const;
  static constexpr std::chrono::milliseconds kRecoveryPoll{5};
  static constexpr std::chrono::seconds kRecoveryTimeout{120};
  // How long a node waits for the other nodes' evidence of a hang.
  static constexpr std::chrono::milliseconds kHangEvidenceWait{3000};
  boost::asio::awaitable<void> explain_hang();

  std::optional<Observed> open_parts();  // hang monitor, event log, health endpoints
  void open_memory_checkpoints();
  void set_state(WorkerState state);  // the group's, told to the observers
  void transition(const Decision& d, const Observed& seen);
  std::vector<ProcessFailure> collect_failures(bool only_with_error_file);
  void log_started();
  bool any_failed() const;
  AttemptView attempt() const;
  std::optional<Clock::time_point> exit_deadline() const;
  boost::asio::awaitable<void> handle_exit_hang();

  // Sources: what each records at once, before its event is queued.
  void arm_signals();
  void on_signal(int sig);
  void on_worker_exit(int local_rank);
  void on_hang(const Hang& hang);

  boost::asio::io_context& io_;
  WorkerSpec spec_;
  std::unique_ptr<RendezvousHandler> rdzv_;
  Guardian* guardian_;
  WorkerGroup group_;
  EventQueue queue_;
  boost::asio::signal_set signals_;
  std::vector<int> reset_signals_;

  // Why workers died of SIGKILL: reads the kernel log from where it ended at the start.
  KillCauses kill_causes_;

  // The running attempt. The warm-start part reaps what its zygote forked: it goes after them.
  std::unique_ptr<WarmStart> warm_;
  std::optional<RunLogDir> logs_;
  std::string attempt_dir_;
  bool keep_logs_ = true;
  std::unique_ptr<ProcessContext> pctx_;
  FilteredFiles filtered_;
  Clock::time_point started_;
  std::optional<Clock::time_point> first_success_;  // a worker of this attempt exited 0
  std::set<int> reported_;                // local ranks whose failure was collected this attempt
  std::vector<ProcessFailure> failures_;  // of the attempt that just ended
  std::set<int> exit_hung_;               // local ranks stopped after --exit-timeout
  std::unique_ptr<InProcessRecovery> recovery_;   // --in-process-recovery
  std::unique_ptr<Standby> standby_;              // its spare worker (binary entrypoints)
  std::optional<Clock::time_point> standby_due_;  // since when one is wanted
  // Across nodes: the last recovery another node began; the generation this node counted
  // itself in (every worker runs a loop of it); whether every node's workers run the current one.
  std::optional<RendezvousHandler::PeerRecovery> peer_recovery_;
  std::optional<int> shared_generation_;
  bool formed_everywhere_ = true;

  // Signals.
  std::optional<int> signal_;
  bool escalate_ = false;       // a second signal: SIGKILL without the grace
  bool in_rendezvous_ = false;  // a signal must interrupt the handler's waits

  // Parts. The hang monitor outlives the status observer, which reads its watchdog; so do the
  // in-memory checkpoints.
  std::unique_ptr<MemoryCheckpoints> memory_;
  std::unique_ptr<CheckpointReplicas> replicas_;  // multi-node: a copy on the next node
  std::unique_ptr<HangMonitor> hangs_;
  JobSummary summary_;
  std::unique_ptr<EventLogObserver> event_log_;
  std::unique_ptr<StatusObserver> status_;
  Observers observers_;
};

}  // namespace ddprun::agent
