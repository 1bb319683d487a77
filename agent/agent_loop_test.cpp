// The agent loop, in process: a scripted rendezvous handler (no store, no network) and real,
// short-lived worker processes (/bin/sh), so each path of the state machine runs as it does in
// ddprun: restart, re-form, a peer's failure, the store lost, a signal during the rendezvous,
// a hang.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "agent/agent.hpp"
#include "store/sys/temp_dir.hpp"
#include "store/sys/wakeup.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

// A rendezvous handler the test scripts: each round forms at once (or, with block_next, only
// when interrupted), and a round may be ended from outside after a delay, as another node or
// the store would.
class ScriptedRendezvous final : public RendezvousHandler {
 public:
  explicit ScriptedRendezvous(asio::io_context& io, int max_restarts)
      : io_(io), max_restarts_(max_restarts), interrupted_(io.get_executor()) {}

  // Round `round` ends with `end`, `after` it formed.
  void end_round(int round, RoundEnd end, std::chrono::milliseconds after = 200ms) {
    scripted_[round] = {std::move(end), after};
  }
  bool block_next = false;  // next_rendezvous waits until interrupt()

  int rounds = 0;  // formed
  bool was_interrupted = false;
  std::optional<Exit> shut_down_as;

  const std::string& run_id() const override { return run_id_; }

  asio::awaitable<RendezvousInfo> next_rendezvous(int local_world_size) override {
    if (block_next) {
      co_await interrupted_.wait();
      throw RendezvousError("rendezvous interrupted");
    }
    round_end_.reset();
    if (restart_next_) ++restarts_;
    restart_next_ = false;
    RendezvousInfo info;
    info.round = rounds++;
    info.world_size = local_world_size;
    info.master_addr = "localhost";
    info.master_port = 1;
    info.store_host = "localhost";
    info.store_port = 1;
    info.restart_count = restarts_;
    info.max_restarts = max_restarts_;
    info.members = {"localhost"};
    if (auto it = scripted_.find(info.round); it != scripted_.end()) {
      auto timer = std::make_shared<asio::steady_timer>(io_, it->second.second);
      RoundEnd end = it->second.first;
      const int round = info.round;
      timer->async_wait([this, timer, end, round](const boost::system::error_code& ec) {
        if (ec || round + 1 != rounds) return;  // that round is over already
        if (end.kind == RoundEnd::Kind::kWorkerFailed) restart_next_ = end.restart_allowed;
        round_end_ = end;
        if (callback_) callback_();
      });
    }
    co_return info;
  }

  std::optional<RoundEnd> round_end() const override { return round_end_; }
  void on_round_end(std::function<void()> callback) override { callback_ = std::move(callback); }

  asio::awaitable<RoundEnd> report_failure(bool) override {
    if (round_end_) co_return *round_end_;  // the first event of the round wins
    RoundEnd end{RoundEnd::Kind::kWorkerFailed, "a worker failed",
                 may_restart(restarts_, max_restarts_)};
    restart_next_ = end.restart_allowed;
    round_end_ = end;
    co_return end;
  }

  asio::awaitable<InPlaceRestart> restart_in_place(int) override {
    if (!may_restart(restarts_, max_restarts_)) co_return InPlaceRestart{};
    co_return InPlaceRestart{++restarts_, {}};
  }

  void interrupt() override {
    was_interrupted = true;
    interrupted_.notify();
  }

  asio::awaitable<void> shutdown(Exit how) override {
    shut_down_as = how;
    co_return;
  }

 private:
  asio::io_context& io_;
  std::string run_id_ = "loop-test";
  int max_restarts_;
  int restarts_ = 0;
  bool restart_next_ = false;
  std::map<int, std::pair<RoundEnd, std::chrono::milliseconds>> scripted_;
  std::optional<RoundEnd> round_end_;
  std::function<void()> callback_;
  sys::Wakeup interrupted_;
};

// Two workers running `script` under /bin/sh; $D is a scratch directory, so a script can act
// differently on a later attempt.
struct LoopTest : ::testing::Test {
  sys::TempDir dir{"ddprun-loop-test-"};
  asio::io_context io{1};

  WorkerSpec spec(const std::string& script) {
    WorkerSpec s;
    s.local_world_size = 2;
    s.program = "/bin/sh";
    s.argv0 = "sh";
    s.args = {"-c", script};
    s.entrypoint_name = "loop_test";
    s.shutdown_timeout = 2s;
    s.signals_to_handle = {SIGTERM, SIGINT};
    s.signals_to_handle_text = "SIGTERM,SIGINT";
    s.log_dir = dir.path() + "/logs";
    s.stack_timeout = 2s;
    s.base_env = {"PATH=/usr/bin:/bin", "D=" + dir.path()};
    return s;
  }

  JobResult run(WorkerSpec s, std::unique_ptr<ScriptedRendezvous>& rdzv) {
    auto handler = std::move(rdzv);
    ScriptedRendezvous* seen = handler.get();
    Agent agent(io, std::move(s), std::move(handler), nullptr);
    JobResult r = agent.run();
    last_rounds = seen->rounds;
    last_interrupted = seen->was_interrupted;
    last_exit = seen->shut_down_as;
    return r;
  }
  int last_rounds = 0;
  bool last_interrupted = false;
  std::optional<RendezvousHandler::Exit> last_exit;
};

// Fails on the first attempt (the second worker), succeeds on the next.
constexpr const char* kFailOnce =
    "[ -e \"$D/failed\" ] && exit 0; "
    "if [ \"$LOCAL_RANK\" = 1 ]; then touch \"$D/failed\"; exit 3; fi; sleep 30";
// Sleeps in the first round, succeeds in the next.
constexpr const char* kSleepOnce =
    "[ -e \"$D/started\" ] && exit 0; touch \"$D/started\"; sleep 30";

TEST_F(LoopTest, FailedWorkerRestartsTheGroupWhileTheBudgetAllows) {
  auto rdzv = std::make_unique<ScriptedRendezvous>(io, 1);
  JobResult r = run(spec(kFailOnce), rdzv);
  EXPECT_EQ(r.kind, JobResult::Kind::kSucceeded) << r.what;
  EXPECT_EQ(last_rounds, 2);
  EXPECT_EQ(last_exit, RendezvousHandler::Exit::kSucceeded);
}

TEST_F(LoopTest, FailedWorkerWithoutRestartsFailsWithItsExitCode) {
  auto rdzv = std::make_unique<ScriptedRendezvous>(io, 0);
  JobResult r = run(spec(kFailOnce), rdzv);
  EXPECT_EQ(r.kind, JobResult::Kind::kWorkersFailed) << r.what;
  ASSERT_TRUE(r.root_cause);
  EXPECT_EQ(r.root_cause->value, 3);
  EXPECT_EQ(last_rounds, 1);
  EXPECT_EQ(last_exit, RendezvousHandler::Exit::kFailed);
}

// Round 0 is ended elsewhere while this node's workers run: they stop, the group forms again
// and the second round's workers succeed.
struct EndedElsewhere {
  RoundEnd end;
  int max_restarts;
};

class RoundEndedElsewhere : public LoopTest,
                            public ::testing::WithParamInterface<EndedElsewhere> {};

TEST_P(RoundEndedElsewhere, StopsTheWorkersAndFormsAgain) {
  auto rdzv = std::make_unique<ScriptedRendezvous>(io, GetParam().max_restarts);
  rdzv->end_round(0, GetParam().end);
  JobResult r = run(spec(kSleepOnce), rdzv);
  EXPECT_EQ(r.kind, JobResult::Kind::kSucceeded) << r.what;
  EXPECT_EQ(last_rounds, 2);
}

INSTANTIATE_TEST_SUITE_P(
    Loop, RoundEndedElsewhere,
    ::testing::Values(
        // A node joined: re-form, no restart spent (the budget is 0).
        EndedElsewhere{{RoundEnd::Kind::kNodeJoined, "a new node is waiting to join", false}, 0},
        // A node died: re-form without it.
        EndedElsewhere{{RoundEnd::Kind::kNodeLost, "node 1 (h1) is gone", false}, 0},
        // Another node's worker failed: restart.
        EndedElsewhere{{RoundEnd::Kind::kWorkerFailed, "node 1 reported a failed worker", true},
                       1}));

TEST_F(LoopTest, LostStoreStopsTheWorkersAndEndsTheJob) {
  auto rdzv = std::make_unique<ScriptedRendezvous>(io, 3);
  rdzv->end_round(0, {RoundEnd::Kind::kStoreLost, "lost the rendezvous store at h:1", false});
  const auto began = std::chrono::steady_clock::now();
  JobResult r = run(spec("sleep 30"), rdzv);
  EXPECT_EQ(r.kind, JobResult::Kind::kStoreLost) << r.what;
  EXPECT_NE(r.what.find("lost the rendezvous store"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - began, 20s);  // the sleeps were stopped
  EXPECT_EQ(last_rounds, 1);
}

TEST_F(LoopTest, SignalDuringTheRendezvousEndsTheWaitAtOnce) {
  auto rdzv = std::make_unique<ScriptedRendezvous>(io, 0);
  rdzv->block_next = true;
  asio::steady_timer later(io, 200ms);
  later.async_wait([](const boost::system::error_code&) { ::kill(::getpid(), SIGTERM); });
  JobResult r = run(spec("exit 0"), rdzv);
  EXPECT_EQ(r.kind, JobResult::Kind::kSignaled) << r.what;
  EXPECT_EQ(r.signal, SIGTERM);
  EXPECT_TRUE(last_interrupted);
  EXPECT_EQ(last_rounds, 0);
  EXPECT_EQ(last_exit, RendezvousHandler::Exit::kLeaving);
}

// No first heartbeat within hang_start_timeout: the worker is hung, its stacks are taken (or
// the file says why not), the group stops; without restarts the job fails as hung.
TEST_F(LoopTest, WorkerWithoutHeartbeatIsHung) {
  auto rdzv = std::make_unique<ScriptedRendezvous>(io, 0);
  WorkerSpec s = spec("sleep 30");
  s.hang_start_timeout = 300ms;
  JobResult r = run(std::move(s), rdzv);
  EXPECT_EQ(r.kind, JobResult::Kind::kWorkerHung) << r.what;
  EXPECT_NE(r.what.find("hung: no first heartbeat"), std::string::npos) << r.what;
  bool stacks = false;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path() + "/logs")) {
    stacks = stacks || entry.path().filename() == "stacks.txt";
  }
  EXPECT_TRUE(stacks);
}

// In-process recovery (--in-process-recovery), with the workers' side of the protocol in sh:
// each announces the generation it runs in; rank 1 fails in generation 0 once rank 0 has
// announced; rank 0 waits for ddprun's notice of generation 1 and announces it, as the
// replacement does. Only rank 1 starts again, in the same round.
constexpr const char* kRecoverInProcess =
    "G=${DDPRUN_RECOVERY_GENERATION:-0}; R=$DDPRUN_RECOVERY_DIR; echo $$ >> \"$D/pids.$RANK\"; "
    "echo $G > \"$R/ready/$RANK\"; "
    "if [ $RANK = 1 ] && [ $G = 0 ]; then "
    "  while [ ! -e \"$R/ready/0\" ]; do sleep 0.01; done; exit 3; fi; "
    "while [ \"$(cat \"$R/generation\" 2>/dev/null)\" != 1 ]; do sleep 0.01; done; "
    "echo 1 > \"$R/ready/$RANK\"; sleep 0.3";

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST_F(LoopTest, InProcessRecoveryStartsOnlyTheFailedWorkerAgain) {
  auto rdzv = std::make_unique<ScriptedRendezvous>(io, 1);
  WorkerSpec s = spec(kRecoverInProcess);
  s.in_process_recovery = true;
  s.recovery_standby = false;
  JobResult r = run(std::move(s), rdzv);
  EXPECT_EQ(r.kind, JobResult::Kind::kSucceeded) << r.what;
  EXPECT_EQ(last_rounds, 1);                               // no new round: the group stayed
  EXPECT_EQ(lines_of(dir.path() + "/pids.0").size(), 1u);  // the survivor: one process
  EXPECT_EQ(lines_of(dir.path() + "/pids.1").size(), 2u);  // the dead rank and its replacement
}

// A program that never announces a TrainingLoop gets no standby: it would run as one more rank.
TEST_F(LoopTest, InProcessRecoveryStartsNoStandbyForAProgramOutsideTheLoop) {
  auto rdzv = std::make_unique<ScriptedRendezvous>(io, 1);
  WorkerSpec s = spec("echo $$ >> \"$D/ran\"; sleep 0.5");
  s.in_process_recovery = true;  // recovery_standby stays on
  JobResult r = run(std::move(s), rdzv);
  EXPECT_EQ(r.kind, JobResult::Kind::kSucceeded) << r.what;
  EXPECT_EQ(lines_of(dir.path() + "/ran").size(), 2u);
}

TEST_F(LoopTest, InProcessRecoveryWithoutARestartLeftFails) {
  auto rdzv = std::make_unique<ScriptedRendezvous>(io, 0);
  WorkerSpec s = spec(kRecoverInProcess);
  s.in_process_recovery = true;
  s.recovery_standby = false;
  JobResult r = run(std::move(s), rdzv);
  EXPECT_EQ(r.kind, JobResult::Kind::kWorkersFailed) << r.what;
  EXPECT_EQ(lines_of(dir.path() + "/pids.1").size(), 1u);
}

}  // namespace
}  // namespace ddprun::agent
