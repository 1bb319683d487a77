// The agent's state machine: the worker group's states, the events that move it, and the one
// decision "in this state, on this event, what next", as a pure function. The agent loop
// (agent.cpp) runs phases (rendezvous, start, monitor, stop) and asks decide() after each
// event; it never decides on its own. agent/README.md has the table that state_machine_test
// checks row by row.
//
//   INIT ──round formed, workers started──▶ HEALTHY ──every node's workers exited 0──▶ SUCCEEDED
//    │                                       │
//    │ rendezvous/start failed,              ├─ own worker failed ─▶ UNHEALTHY ─stop─▶ STOPPED
//    │ store lost ─▶ FAILED                  ├─ peer failed, node joined/lost ──stop─▶ STOPPED
//    │ signal ─▶ STOPPED                     ├─ store lost, signal ─────────────stop─▶ STOPPED
//    │ job done ─▶ SUCCEEDED                 │
//    ▼                                       STOPPED ─▶ INIT (restart: a restart is left;
//                                                            re-form: no restart spent)
//                                            STOPPED ─▶ FAILED (no restart left, store lost)
//                                            STOPPED stays (signal: ddprun exits)
//
// A hang (agent/hang/) is one more event, handled like a worker failure: the hung worker's
// stacks are captured, the group is stopped and restarted if the job's budget allows.
//
// In-process recovery (--in-process-recovery, workers in ddprun::TrainingLoop):
//
//   HEALTHY ──worker failed, the others can recover──▶ RECOVERING (only the dead rank is
//            in process (a restart is spent)                  started again; the others stay)
//   HEALTHY ──another node replaces its worker──▶ RECOVERING (this node's workers rebuild)
//   RECOVERING ──every rank runs the new generation──▶ HEALTHY
//   RECOVERING ──another worker failed──▶ STOPPED ─▶ INIT (the full restart above)
//   RECOVERING: any other event as in HEALTHY
#pragma once

#include <string_view>

namespace ddprun::agent {

enum class WorkerState { kInit, kHealthy, kRecovering, kUnhealthy, kStopped, kSucceeded, kFailed };

enum class Event {
  kWorkersSucceeded,  // every worker of this node exited 0
  kWorkerFailed,      // a worker of this node exited non-zero
  kWorkerHung,        // a worker of this node hung (no heartbeat, a FileTimer scope expired)
  kSignal,            // ddprun received one of --signals-to-handle
  kNodeJoined,        // round end: a node waits to join (a round with room)
  kNodeLost,          // round end: a member node died or left
  kPeerFailed,        // round end: another node's worker failed
  kJobDone,           // round end: every node's workers exited 0
  kStoreLost,         // round end: the rendezvous store is gone
  kRendezvousFailed,  // no round could be formed
  kStartFailed,       // the workers could not be started
  // In-process recovery (agent/in_process_recovery.hpp):
  kWorkerReplaceable,  // a worker of this node failed; every other one can rebuild its group
  kRecovered,          // every worker runs the rebuilt group
  kPeerRecovering,     // another node replaces its failed worker; this node's rebuild with it
};

// What the agent does about an event.
enum class Action {
  kAwaitOthers,  // this node is done: wait for the others (the exit barrier)
  kSucceed,      // the job succeeded: leave
  kRestart,      // stop the workers; the next round counts one more restart
  kReform,       // stop the workers; rendezvous again without spending a restart
  kFail,         // stop the workers; no restart left: print the summary, leave
  kExit,         // stop the workers (if any); leave (signal, store lost, cannot start)
  kReplace,      // start the failed workers again, alone; the others rebuild their group
  kResume,       // the recovery is done: carry on
  kFollow,       // this node's workers rebuild their group with another node's replacement
};

struct Decision {
  Action action;
  bool stop_workers;  // stop the group first (signal, grace, SIGKILL); STOPPED after that
  WorkerState next;   // the state once the action is done

  bool operator==(const Decision&) const = default;
};

// The decision for `event` in `state`. `restart_allowed` is the rendezvous handler's answer
// (it owns the job's restart budget) and matters only for failures. Throws std::logic_error
// for an event that cannot happen in that state (a bug in the caller).
Decision decide(WorkerState state, Event event, bool restart_allowed);

std::string_view to_string(WorkerState state);
std::string_view to_string(Event event);
std::string_view to_string(Action action);

}  // namespace ddprun::agent
