#include "agent/state_machine.hpp"

#include <stdexcept>
#include <string>

namespace ddprun::agent {
namespace {

using S = WorkerState;
using E = Event;
using A = Action;

[[noreturn]] void impossible(WorkerState state, Event event) {
  throw std::logic_error("agent state machine: event " + std::string(to_string(event)) +
                         " cannot happen in state " + std::string(to_string(state)));
}

// While a round is being formed or the workers are being started (nothing runs yet).
Decision decide_init(Event event) {
  switch (event) {
    case E::kSignal:
      return {A::kExit, false, S::kStopped};
    case E::kJobDone:  // the job finished while this node re-formed
      return {A::kSucceed, false, S::kSucceeded};
    case E::kRendezvousFailed:
    case E::kStartFailed:
    case E::kStoreLost:
      return {A::kExit, false, S::kFailed};
    default:
      impossible(S::kInit, event);
  }
}

// While the workers run (or, after kWorkersSucceeded, while the exit barrier waits).
Decision decide_healthy(Event event, bool restart_allowed) {
  switch (event) {
    case E::kWorkersSucceeded:
      return {A::kAwaitOthers, false, S::kHealthy};
    case E::kJobDone:
      return {A::kSucceed, false, S::kSucceeded};
    case E::kWorkerFailed:
    case E::kWorkerHung:
    case E::kPeerFailed:
      return restart_allowed ? Decision{A::kRestart, true, S::kInit}
                             : Decision{A::kFail, true, S::kFailed};
    case E::kNodeJoined:
    case E::kNodeLost:
      return {A::kReform, true, S::kInit};
    case E::kStoreLost:
      return {A::kExit, true, S::kFailed};
    case E::kSignal:
      return {A::kExit, true, S::kStopped};
    case E::kWorkerReplaceable:
      return restart_allowed ? Decision{A::kReplace, false, S::kRecovering}
                             : Decision{A::kFail, true, S::kFailed};
    case E::kPeerRecovering:  // the other node spent the restart
      return {A::kFollow, false, S::kRecovering};
    case E::kRendezvousFailed:
    case E::kStartFailed:
    case E::kRecovered:
      impossible(S::kHealthy, event);
  }
  impossible(S::kHealthy, event);
}

// While the failed workers' replacements join the survivors' rebuilt group. A second failure
// ends the recovery: the whole group restarts.
Decision decide_recovering(Event event, bool restart_allowed) {
  switch (event) {
    case E::kRecovered:
      return {A::kResume, false, S::kHealthy};
    case E::kWorkerReplaceable:
      return decide_healthy(E::kWorkerFailed, restart_allowed);
    case E::kPeerRecovering:  // (the loop ends the round for every node first)
      return decide_healthy(E::kPeerFailed, restart_allowed);
    case E::kRendezvousFailed:
    case E::kStartFailed:
      impossible(S::kRecovering, event);
    default:
      return decide_healthy(event, restart_allowed);
  }
}

}  // namespace

Decision decide(WorkerState state, Event event, bool restart_allowed) {
  switch (state) {
    case S::kInit:
      return decide_init(event);
    case S::kHealthy:
      return decide_healthy(event, restart_allowed);
    case S::kRecovering:
      return decide_recovering(event, restart_allowed);
    case S::kUnhealthy:  // transient: the loop is stopping the workers
    case S::kStopped:
    case S::kSucceeded:
    case S::kFailed:
      break;
  }
  impossible(state, event);
}

std::string_view to_string(WorkerState state) {
  switch (state) {
    case S::kInit:
      return "INIT";
    case S::kHealthy:
      return "HEALTHY";
    case S::kRecovering:
      return "RECOVERING";
    case S::kUnhealthy:
      return "UNHEALTHY";
    case S::kStopped:
      return "STOPPED";
    case S::kSucceeded:
      return "SUCCEEDED";
    case S::kFailed:
      return "FAILED";
  }
  return "?";
}

std::string_view to_string(Event event) {
  switch (event) {
    case E::kWorkersSucceeded:
      return "workers-succeeded";
    case E::kWorkerFailed:
      return "worker-failed";
    case E::kWorkerHung:
      return "worker-hung";
    case E::kSignal:
      return "signal";
    case E::kNodeJoined:
      return "node-joined";
    case E::kNodeLost:
      return "node-lost";
    case E::kPeerFailed:
      return "peer-failed";
    case E::kJobDone:
      return "job-done";
    case E::kStoreLost:
      return "store-lost";
    case E::kRendezvousFailed:
      return "rendezvous-failed";
    case E::kStartFailed:
      return "start-failed";
    case E::kWorkerReplaceable:
      return "worker-replaceable";
    case E::kRecovered:
      return "recovered";
    case E::kPeerRecovering:
      return "peer-recovering";
  }
  return "?";
}

std::string_view to_string(Action action) {
  switch (action) {
    case A::kAwaitOthers:
      return "await-others";
    case A::kSucceed:
      return "succeed";
    case A::kRestart:
      return "restart";
    case A::kReform:
      return "re-form";
    case A::kFail:
      return "fail";
    case A::kExit:
      return "exit";
    case A::kReplace:
      return "replace";
    case A::kResume:
      return "resume";
    case A::kFollow:
      return "follow";
  }
  return "?";
}

}  // namespace ddprun::agent
