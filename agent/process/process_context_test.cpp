#include "agent/process/process_context.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
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

// In-process recovery: one exited worker starts again, appending to its log file; a respawn
// that cannot start leaves the worker as it was.
TEST_F(ProcessContextTest, RespawnStartsOneExitedWorkerAgain) {
  ProcessContext pctx(io_, nullptr, nullptr);
  std::vector<WorkerLaunch> ls;
  ls.push_back(sh(0, "echo first; exit 3"));
  ls[0].out.kind = StreamTarget::Kind::kFile;
  ls[0].out.path = (dir_ / "out.log").string();
  pctx.start("/bin/sh", std::move(ls), {});
  run_all(pctx);
  const pid_t first = pctx.pid_of(0);
  WorkerLaunch again = sh(0, "echo second; exit 0");
  again.out = pctx.launch_of(0).out;
  again.out.append = true;
  pctx.respawn(0, "/bin/sh", std::move(again), {});
  EXPECT_FALSE(pctx.exit_of(0).has_value());
  io_.restart();  // it ran out of work when the first worker exited
  run_all(pctx);
  EXPECT_NE(pctx.pid_of(0), first);
  EXPECT_EQ(pctx.exit_of(0)->status, ExitStatus::exited(0));
  EXPECT_EQ(slurp(dir_ / "out.log"), "first\nsecond\n");
  WorkerLaunch unwritable = sh(0, "exit 0");
  unwritable.out.kind = StreamTarget::Kind::kFile;
  unwritable.out.path = (dir_ / "no" / "such" / "dir.log").string();
  EXPECT_THROW(pctx.respawn(0, "/bin/sh", std::move(unwritable), {}), std::system_error);
  EXPECT_EQ(pctx.exit_of(0)->status, ExitStatus::exited(0));  // as it was
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

// A descriptor closed while a forked process still holds a copy of it stays in the epoll set
// (epoll forgets a registration with the last copy of the open file), and asio gives its freed
// record to the next descriptor registered: here the worker's pidfd, which then sees the dead
// descriptor's events. The agent spawns workers with fork, so this happens when the agent
// closes a connection while a worker is between fork and exec. Such a readiness is no exit:
// the worker runs on, and nothing blocks (the agent used to wait in waitid until the worker
// really exited, its event loop frozen: etcd leases lapsed, rendezvous stalled).
TEST_F(ProcessContextTest, AnotherDescriptorsReadinessIsNoExit) {
  using namespace std::chrono_literals;
  // A socket asio opened itself (asio leaves those to close() to drop from the epoll set).
  using boost::asio::ip::tcp;
  tcp::acceptor acceptor(io_, tcp::endpoint(boost::asio::ip::address_v4::loopback(), 0));
  auto dead = std::make_unique<tcp::socket>(io_);
  dead->connect(acceptor.local_endpoint());
  tcp::socket peer = acceptor.accept();
  const pid_t holder = ::fork();  // keeps a copy of the socket open
  if (holder == 0) {
    ::pause();
    ::_exit(0);
  }
  ASSERT_GT(holder, 0);
  dead.reset();  // closed through asio: its record is freed, its registration stays
  int exits = 0;
  ProcessContext pctx(io_, nullptr, [&](int) { ++exits; });
  std::vector<WorkerLaunch> ls;
  ls.push_back(sh(0, "exec sleep 5"));
  pctx.start("/bin/sh", std::move(ls), {});
  boost::asio::write(peer, boost::asio::buffer("x", 1));  // the closed one becomes readable
  const auto began = std::chrono::steady_clock::now();
  io_.run_for(500ms);
  EXPECT_LT(std::chrono::steady_clock::now() - began, 2s);
  EXPECT_EQ(exits, 0);
  EXPECT_TRUE(alive(pctx.pid_of(0)));
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  ::kill(pctx.pid_of(0), SIGKILL);
  run_all(pctx);
  EXPECT_EQ(exits, 1);
  EXPECT_EQ(pctx.exit_of(0)->status, ExitStatus::signaled(SIGKILL));
}

}  // namespace
}  // namespace ddprun::agent
