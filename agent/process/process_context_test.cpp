#include "agent/process/process_context.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;

class ProcessContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ddprun_pctx_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  WorkerLaunch sh(int rank, const std::string& script) {
    WorkerLaunch l;
    l.local_rank = rank;
    l.global_rank = rank;
    l.argv = {"sh", "-c", script};
    l.env = {"PATH=/usr/bin:/bin", "RANK=" + std::to_string(rank)};
    return l;
  }

  // Runs the io_context until every worker has exited.
  void run_all(ProcessContext& pctx) {
    while (!pctx.all_exited()) io_.run_one();
  }

  static std::string slurp(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  static bool alive(pid_t pid) {
    if (::kill(pid, 0) != 0) return false;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string s((std::istreambuf_iterator<char>(stat)), {});
    auto close = s.rfind(')');
    return close != std::string::npos && s.size() > close + 2 && s[close + 2] != 'Z';
  }

  boost::asio::io_context io_;
  fs::path dir_;
};

TEST_F(ProcessContextTest, ReportsExitCodesAndSignals) {
  int exits = 0;
  ProcessContext pctx(io_, nullptr, [&](int) { ++exits; });
  std::vector<WorkerLaunch> ls;
  ls.push_back(sh(0, "exit 3"));
  ls.push_back(sh(1, "kill -9 $$"));
  ls.push_back(sh(2, "exit 0"));
  pctx.start("/bin/sh", std::move(ls), {});
  run_all(pctx);
  EXPECT_EQ(exits, 3);
  EXPECT_EQ(pctx.exit_of(0)->status, ExitStatus::exited(3));
  EXPECT_EQ(pctx.exit_of(1)->status, ExitStatus::signaled(9));
  EXPECT_EQ(pctx.exit_of(2)->status, ExitStatus::exited(0));
}

TEST_F(ProcessContextTest, SignalAllReachesTheWorkers) {
  ProcessContext pctx(io_, nullptr, nullptr);
  std::vector<WorkerLaunch> ls;
  ls.push_back(sh(0, "exec sleep 1000"));
  auto ready = dir_ / "ready";
  ls.push_back(
      sh(1, "trap 'exit 7' TERM; : > " + ready.string() + "; while :; do sleep 0.01; done"));
  pctx.start("/bin/sh", std::move(ls), {});
  // The trap has no event to wait on: the worker says when it is installed.
  for (int i = 0; i < 5000 && !fs::exists(ready); ++i) ::usleep(1000);
  pctx.signal_all(SIGTERM);
  run_all(pctx);
  EXPECT_EQ(pctx.exit_of(0)->status, ExitStatus::signaled(SIGTERM));
  EXPECT_EQ(pctx.exit_of(1)->status, ExitStatus::exited(7));
}

TEST_F(ProcessContextTest, TeeWritesFileAndPrefixedWholeLines) {
  int console[2];
  ASSERT_EQ(::pipe(console), 0);
  ProcessContext pctx(io_, nullptr, nullptr);
  auto l = sh(0, "printf 'one\\ntw'; printf 'o\\nthree'; printf 'err\\n' >&2");
  l.out.kind = StreamTarget::Kind::kTee;
  l.out.path = (dir_ / "stdout.log").string();
  l.out.console_fd = console[1];
  l.out.prefix = "[default0]:";
  l.err.kind = StreamTarget::Kind::kFile;
  l.err.path = (dir_ / "stderr.log").string();
  std::vector<WorkerLaunch> ls;
  ls.push_back(std::move(l));
  pctx.start("/bin/sh", std::move(ls), {});
  run_all(pctx);
  ::close(console[1]);
  std::string shown;
  char buf[256];
  ssize_t n;
  while ((n = ::read(console[0], buf, sizeof(buf))) > 0) shown.append(buf, static_cast<size_t>(n));
  ::close(console[0]);
  EXPECT_EQ(shown, "[default0]:one\n[default0]:two\n[default0]:three\n");
  EXPECT_EQ(slurp(dir_ / "stdout.log"), "one\ntwo\nthree");
  EXPECT_EQ(slurp(dir_ / "stderr.log"), "err\n");
}

TEST_F(ProcessContextTest, WorkersLeadTheirOwnProcessGroupAndTheirChildrenDieWithThem) {
  ProcessContext pctx(io_, nullptr, nullptr);
  auto pidfile = (dir_ / "grandchild").string();
  std::vector<WorkerLaunch> ls;
  ls.push_back(sh(0, "sleep 1000 & echo $! > " + pidfile + "; ps -o pgid= -p $$ > " + pidfile +
                         ".pgid; exit 0"));
  pctx.start("/bin/sh", std::move(ls), {});
  run_all(pctx);
  EXPECT_EQ(pctx.exit_of(0)->status, ExitStatus::exited(0));
  pid_t grandchild = std::stoi(slurp(pidfile));
  EXPECT_EQ(std::stoi(slurp(pidfile + ".pgid")), pctx.pid_of(0));
  for (int i = 0; i < 1000 && alive(grandchild); ++i) ::usleep(1000);
  EXPECT_FALSE(alive(grandchild));
}

TEST_F(ProcessContextTest, ExecFailureIsExit127WithAMessage) {
  ProcessContext pctx(io_, nullptr, nullptr);
  auto l = sh(0, "");
  l.err.kind = StreamTarget::Kind::kFile;
  l.err.path = (dir_ / "stderr.log").string();
  std::vector<WorkerLaunch> ls;
  ls.push_back(std::move(l));
  pctx.start("/nonexistent/program", std::move(ls), {});
  run_all(pctx);
  EXPECT_EQ(pctx.exit_of(0)->status.kind, ExitStatus::Kind::kExecFailed);
  EXPECT_EQ(pctx.exit_of(0)->status.value, ENOENT);
  EXPECT_EQ(pctx.exit_of(0)->status.torchrun_code(), 127);
  EXPECT_NE(slurp(dir_ / "stderr.log").find("cannot execute /nonexistent/program"),
            std::string::npos);
}

TEST_F(ProcessContextTest, DestructorKillsAndReapsRunningWorkers) {
  pid_t pid;
  {
    ProcessContext pctx(io_, nullptr, nullptr);
    std::vector<WorkerLaunch> ls;
    ls.push_back(sh(0, "exec sleep 1000"));
    pctx.start("/bin/sh", std::move(ls), {});
    pid = pctx.pid_of(0);
    EXPECT_TRUE(alive(pid));
  }
  EXPECT_NE(::kill(pid, 0), 0);  // killed and reaped: no zombie left
}

}  // namespace
}  // namespace ddprun::agent
