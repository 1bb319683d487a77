// Observers of the agent loop: what a person or a program sees of the job (the event log, the
// health endpoints, the summary line) is built by observers from what the loop reports, each
// owning what it needs; the loop itself keeps none of it. A new view of the job is a new
// observer (agent.cpp registers them), not a member of the agent.
//
// Every callback runs on the io_context thread, synchronously, in registration order.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "agent/agent.hpp"
#include "agent/hang/collective_judge.hpp"
#include "agent/hang/watchdog.hpp"
#include "agent/process/exit_status.hpp"
#include "agent/process/stack_dump.hpp"
#include "agent/rendezvous/rendezvous.hpp"
#include "agent/state_machine.hpp"

namespace ddprun::agent {

using Millis = std::chrono::milliseconds;

// What ended a phase: the event for the state machine, with the handler's answer on restarts.
struct Observed {
  Event event;
  bool restart_allowed = false;
  std::string what;  // for the log: which node, which error
};

struct StartedWorker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = 0;
};

struct ExitedWorker {
  int local_rank = 0;
  int rank = -1;  // -1: unknown
  pid_t pid = 0;
  ExitStatus status;
  int attempt = 0;
  uint64_t peak_rss_kb = 0;  // 0: unknown
  std::string cause;         // a SIGKILL's sender (agent/process/kill_cause.hpp)
};

class AgentObserver {
 public:
  virtual ~AgentObserver() = default;

  // The worker group's state, on every change (transitions, and the phases' own steps).
  virtual void on_state(WorkerState state) { (void)state; }
  // A rendezvous round formed, `took` after the agent asked for it.
  virtual void on_round(const RendezvousInfo& round, Millis took) { (void)round, (void)took; }
  // The new round counts one more restart than the last: the group restarts.
  virtual void on_restart(const RendezvousInfo& round) { (void)round; }
  // An attempt's workers are running.
  virtual void on_attempt(const RendezvousInfo& round, const std::vector<StartedWorker>& workers) {
    (void)round, (void)workers;
  }
  virtual void on_worker_exit(const ExitedWorker& exit) { (void)exit; }
  // In-process recovery: `worker` was started again alone, to join process group `generation`;
  // `round` carries the restart count that includes it.
  virtual void on_worker_replaced(const RendezvousInfo& round, const StartedWorker& worker,
                                  int generation) {
    (void)round, (void)worker, (void)generation;
  }
  // A worker was found hung; the group will stop. `rank`: its global rank.
  virtual void on_hang_found(const Hang& hang, int rank) { (void)hang, (void)rank; }
  // A FileTimer scope expired that asked for no signal: noted, nothing done.
  virtual void on_hang_ignored(const Hang& hang, int rank) { (void)hang, (void)rank; }
  // A hung worker's stacks were taken.
  virtual void on_hang_captured(const Hang& hang, int rank, const StackDump& stacks, int attempt) {
    (void)hang, (void)rank, (void)stacks, (void)attempt;
  }
  // A hang's collective was judged (flight recorders and stacks, before the stop): who waits,
  // in which collective, for whom. Only when the evidence showed a collective in flight.
  virtual void on_collective_judged(const CollectiveVerdict& verdict, int attempt) {
    (void)verdict, (void)attempt;
  }
  // A worker still ran --exit-timeout after another exited 0: its stacks were taken, it stops.
  virtual void on_exit_hang(const StartedWorker& worker, const std::string& why,
                            const StackDump& stacks, int attempt) {
    (void)worker, (void)why, (void)stacks, (void)attempt;
  }
  virtual void on_transition(WorkerState from, const Decision& d, const Observed& seen,
                             const RendezvousInfo& round) {
    (void)from, (void)d, (void)seen, (void)round;
  }
  virtual void on_job_end(const JobResult& result, const RendezvousInfo& round) {
    (void)result, (void)round;
  }
};

// The observers of one agent, called in the order they were added.
class Observers {
 public:
  void add(AgentObserver* observer) { list_.push_back(observer); }
  template <typename F>
  void each(F&& f) const {
    for (AgentObserver* o : list_) f(*o);
  }

 private:
  std::vector<AgentObserver*> list_;
};

}  // namespace ddprun::agent
