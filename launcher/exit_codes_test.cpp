#include "launcher/exit_codes.hpp"

#include <errno.h>
#include <gtest/gtest.h>
#include <signal.h>

namespace ddprun::launcher {
namespace {

using agent::ExitStatus;
using agent::JobResult;
using Kind = JobResult::Kind;

JobResult result(Kind kind) {
  JobResult r;
  r.kind = kind;
  return r;
}

JobResult failed(std::optional<ExitStatus> root_cause) {
  JobResult r = result(Kind::kWorkersFailed);
  r.root_cause = root_cause;
  return r;
}

TEST(ExitCodes, Succeeded) {
  EXPECT_EQ(exit_code(result(Kind::kSucceeded)), 0);
}

TEST(ExitCodes, WorkersFailedExitsAsAShellReportsTheRootCause) {
  EXPECT_EQ(exit_code(failed(ExitStatus::exited(3))), 3);
  EXPECT_EQ(exit_code(failed(ExitStatus::exited(255))), 255);
  EXPECT_EQ(exit_code(failed(ExitStatus::signaled(SIGKILL))), 137);
  EXPECT_EQ(exit_code(failed(ExitStatus::signaled(SIGSEGV))), 139);
  EXPECT_EQ(exit_code(failed(ExitStatus::exec_failed(ENOENT))), 127);
}

TEST(ExitCodes, WorkersFailedElsewhereOrWithoutAStatusIsOne) {
  EXPECT_EQ(exit_code(failed(std::nullopt)), 1);           // another node's worker
  EXPECT_EQ(exit_code(failed(ExitStatus::exited(0))), 1);  // never 0 for a failed job
}

TEST(ExitCodes, AHungRootCauseIs124WhateverKilledIt) {
  JobResult r = result(Kind::kWorkerHung);
  r.root_cause = ExitStatus::signaled(SIGKILL);
  EXPECT_EQ(exit_code(r), 124);
  r.root_cause = ExitStatus::signaled(SIGTERM);
  EXPECT_EQ(exit_code(r), kExitHang);
}

TEST(ExitCodes, SignaledIs128PlusTheSignal) {
  JobResult r = result(Kind::kSignaled);
  r.signal = SIGTERM;
  EXPECT_EQ(exit_code(r), 143);
  r.signal = SIGINT;
  EXPECT_EQ(exit_code(r), 130);
  r.signal = 0;  // no signal recorded: still a failure, never 128
  EXPECT_EQ(exit_code(r), 1);
}

TEST(ExitCodes, DdprunsOwnFailuresAreOne) {
  EXPECT_EQ(exit_code(result(Kind::kRendezvousFailed)), kExitFailure);
  EXPECT_EQ(exit_code(result(Kind::kStoreLost)), kExitFailure);
  EXPECT_EQ(exit_code(result(Kind::kStartFailed)), kExitFailure);
}

TEST(ExitCodes, Constants) {
  EXPECT_EQ(kExitSuccess, 0);
  EXPECT_EQ(kExitFailure, 1);
  EXPECT_EQ(kExitUsage, 2);
  EXPECT_EQ(kExitHang, 124);
  EXPECT_EQ(kExitSignalBase, 128);
}

}  // namespace
}  // namespace ddprun::launcher
