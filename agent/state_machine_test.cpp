// The state table of agent/README.md, row by row. Every (state, event, restart allowed)
// combination not in the table must be refused: the loop never asks for it.
#include "agent/state_machine.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <vector>

namespace ddprun::agent {
namespace {

using S = WorkerState;
using E = Event;
using A = Action;

struct Row {
  S state;
  E event;
  std::optional<bool> restart_allowed;  // nullopt: the same either way
  Decision decision;
};

// Keep in step with the table in agent/README.md ("The state machine").
const std::vector<Row> kTable = {
    {S::kInit, E::kSignal, {}, {A::kExit, false, S::kStopped}},
    {S::kInit, E::kJobDone, {}, {A::kSucceed, false, S::kSucceeded}},
    {S::kInit, E::kRendezvousFailed, {}, {A::kExit, false, S::kFailed}},
    {S::kInit, E::kStartFailed, {}, {A::kExit, false, S::kFailed}},
    {S::kInit, E::kStoreLost, {}, {A::kExit, false, S::kFailed}},
    {S::kHealthy, E::kWorkersSucceeded, {}, {A::kAwaitOthers, false, S::kHealthy}},
    {S::kHealthy, E::kJobDone, {}, {A::kSucceed, false, S::kSucceeded}},
    {S::kHealthy, E::kWorkerFailed, true, {A::kRestart, true, S::kInit}},
    {S::kHealthy, E::kWorkerFailed, false, {A::kFail, true, S::kFailed}},
    {S::kHealthy, E::kWorkerHung, true, {A::kRestart, true, S::kInit}},
    {S::kHealthy, E::kWorkerHung, false, {A::kFail, true, S::kFailed}},
    {S::kHealthy, E::kPeerFailed, true, {A::kRestart, true, S::kInit}},
    {S::kHealthy, E::kPeerFailed, false, {A::kFail, true, S::kFailed}},
    {S::kHealthy, E::kNodeJoined, {}, {A::kReform, true, S::kInit}},
    {S::kHealthy, E::kNodeLost, {}, {A::kReform, true, S::kInit}},
    {S::kHealthy, E::kStoreLost, {}, {A::kExit, true, S::kFailed}},
    {S::kHealthy, E::kSignal, {}, {A::kExit, true, S::kStopped}},
    {S::kHealthy, E::kWorkerReplaceable, true, {A::kReplace, false, S::kRecovering}},
    {S::kHealthy, E::kWorkerReplaceable, false, {A::kFail, true, S::kFailed}},
    {S::kHealthy, E::kPeerRecovering, {}, {A::kFollow, false, S::kRecovering}},
    {S::kRecovering, E::kRecovered, {}, {A::kResume, false, S::kHealthy}},
    {S::kRecovering, E::kPeerRecovering, true, {A::kRestart, true, S::kInit}},
    {S::kRecovering, E::kPeerRecovering, false, {A::kFail, true, S::kFailed}},
    {S::kRecovering, E::kWorkerReplaceable, true, {A::kRestart, true, S::kInit}},
    {S::kRecovering, E::kWorkerReplaceable, false, {A::kFail, true, S::kFailed}},
    {S::kRecovering, E::kWorkersSucceeded, {}, {A::kAwaitOthers, false, S::kHealthy}},
    {S::kRecovering, E::kJobDone, {}, {A::kSucceed, false, S::kSucceeded}},
    {S::kRecovering, E::kWorkerFailed, true, {A::kRestart, true, S::kInit}},
    {S::kRecovering, E::kWorkerFailed, false, {A::kFail, true, S::kFailed}},
    {S::kRecovering, E::kWorkerHung, true, {A::kRestart, true, S::kInit}},
    {S::kRecovering, E::kWorkerHung, false, {A::kFail, true, S::kFailed}},
    {S::kRecovering, E::kPeerFailed, true, {A::kRestart, true, S::kInit}},
    {S::kRecovering, E::kPeerFailed, false, {A::kFail, true, S::kFailed}},
    {S::kRecovering, E::kNodeJoined, {}, {A::kReform, true, S::kInit}},
    {S::kRecovering, E::kNodeLost, {}, {A::kReform, true, S::kInit}},
    {S::kRecovering, E::kStoreLost, {}, {A::kExit, true, S::kFailed}},
    {S::kRecovering, E::kSignal, {}, {A::kExit, true, S::kStopped}},
};

const std::vector<S> kStates = {S::kInit,    S::kHealthy,   S::kRecovering, S::kUnhealthy,
                                S::kStopped, S::kSucceeded, S::kFailed};
const std::vector<E> kEvents = {E::kWorkersSucceeded, E::kWorkerFailed,  E::kWorkerHung,
                                E::kSignal,           E::kNodeJoined,    E::kNodeLost,
                                E::kPeerFailed,       E::kJobDone,       E::kStoreLost,
                                E::kRendezvousFailed, E::kStartFailed,   E::kWorkerReplaceable,
                                E::kRecovered,        E::kPeerRecovering};

std::optional<Decision> expected(S state, E event, bool restart_allowed) {
  for (const Row& r : kTable) {
    if (r.state == state && r.event == event &&
        (!r.restart_allowed || *r.restart_allowed == restart_allowed)) {
      return r.decision;
    }
  }
  return std::nullopt;
}

TEST(StateMachine, EveryCombinationFollowsTheTable) {
  int decided = 0;
  for (S state : kStates) {
    for (E event : kEvents) {
      for (bool allowed : {false, true}) {
        SCOPED_TRACE(std::string(to_string(state)) + " + " + std::string(to_string(event)) +
                     (allowed ? " (restart allowed)" : " (no restart left)"));
        if (auto want = expected(state, event, allowed)) {
          EXPECT_EQ(decide(state, event, allowed), *want);
          ++decided;
        } else {
          EXPECT_THROW(decide(state, event, allowed), std::logic_error);
        }
      }
    }
  }
  // 19 rows that ignore restart_allowed, x 2; 18 rows that use it.
  EXPECT_EQ(decided, 56);
}

TEST(StateMachine, OnlyFailuresDependOnTheRestartBudget) {
  for (E event : kEvents) {
    if (event == E::kWorkerFailed || event == E::kWorkerHung || event == E::kPeerFailed ||
        event == E::kWorkerReplaceable || event == E::kPeerRecovering) {
      continue;
    }
    for (S state : {S::kHealthy, S::kRecovering}) {
      try {
        EXPECT_EQ(decide(state, event, true), decide(state, event, false));
      } catch (const std::logic_error&) {
      }
    }
  }
}

TEST(StateMachine, StoppingActionsEndOutsideHealthy) {
  for (const Row& r : kTable) {
    if (r.decision.stop_workers) {
      EXPECT_NE(r.decision.next, S::kHealthy);
      EXPECT_NE(r.decision.next, S::kRecovering);
    }
    // The one recovery that keeps workers running starts only the failed ones.
    if (r.decision.next == S::kRecovering) {
      EXPECT_FALSE(r.decision.stop_workers);
    }
    if (r.decision.action == A::kRestart || r.decision.action == A::kReform) {
      EXPECT_EQ(r.decision.next, S::kInit);
    }
  }
}

TEST(StateMachine, NamesForLogLines) {
  EXPECT_EQ(to_string(S::kUnhealthy), "UNHEALTHY");
  EXPECT_EQ(to_string(E::kNodeLost), "node-lost");
  EXPECT_EQ(to_string(A::kReform), "re-form");
  EXPECT_EQ(to_string(S::kRecovering), "RECOVERING");
  EXPECT_EQ(to_string(E::kWorkerReplaceable), "worker-replaceable");
  EXPECT_EQ(to_string(A::kReplace), "replace");
  EXPECT_EQ(to_string(E::kPeerRecovering), "peer-recovering");
  EXPECT_EQ(to_string(A::kFollow), "follow");
}

}  // namespace
}  // namespace ddprun::agent
