// The --event-log observer: one JSON line per transition, round, worker start and exit, hang,
// restart and the job's end (the fields are listed in event_log.hpp).
#pragma once

#include "agent/agent_observer.hpp"
#include "agent/event_log.hpp"
#include "agent/job_summary.hpp"

namespace ddprun::agent {

class EventLogObserver final : public AgentObserver {
 public:
  // `summary` (the counts of job_end) must outlive this.
  EventLogObserver(EventLog log, const JobSummary& summary)
      : log_(std::move(log)), summary_(summary) {}

  void on_round(const RendezvousInfo& round, Millis took) override;
  void on_restart(const RendezvousInfo& round) override;
  void on_attempt(const RendezvousInfo& round, const std::vector<StartedWorker>& workers) override;
  void on_worker_exit(const ExitedWorker& exit) override;
  void on_worker_replaced(const RendezvousInfo& round, const StartedWorker& worker,
                          int generation) override;
  void on_hang_ignored(const Hang& hang, int rank) override;
  void on_hang_captured(const Hang& hang, int rank, const StackDump& stacks, int attempt) override;
  void on_collective_judged(const CollectiveVerdict& verdict, int attempt) override;
  void on_exit_hang(const StartedWorker& worker, const std::string& why, const StackDump& stacks,
                    int attempt) override;
  void on_transition(WorkerState from, const Decision& d, const Observed& seen,
                     const RendezvousInfo& round) override;
  void on_job_end(const JobResult& result, const RendezvousInfo& round) override;

 private:
  EventLog log_;
  const JobSummary& summary_;
};

// "workers_failed", "signaled", ...: JobResult::Kind as the event log and tests name it.
const char* result_name(JobResult::Kind kind);

}  // namespace ddprun::agent
