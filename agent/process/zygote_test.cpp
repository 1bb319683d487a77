// The warm-start zygote with a real Python interpreter (no torch: it imports `json`): its ready
// report, workers forked through ProcessContext with their exit codes and signals, a failing
// script's traceback without the zygote's frames, the rest of a worker's process group killed
// with it, and a zygote that dies. tests/launcher/test_warm_start.py compares warm and cold
// workers under torch.
#include "agent/process/zygote.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent/process/process_context.hpp"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* kPython = "/usr/bin/python3";

class ZygoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ddprun_zygote_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<Zygote> start(std::vector<std::string> modules = {"json"}) {
    ZygoteOptions o;
    o.python = kPython;
    o.argv0 = "python3";
    o.modules = std::move(modules);
    o.env = {"PATH=/usr/bin:/bin"};
    o.log_path = (dir_ / "zygote.log").string();
    auto z = std::make_unique<Zygote>(std::move(o));
    for (int i = 0; i < 3000 && !z->ready() && !z->failed(); ++i) std::this_thread::sleep_for(10ms);
    return z;
  }

  // A launch of `python3 -u <dir>/<name>.py` whose script is `code`.
  WorkerLaunch script(int rank, const std::string& name, const std::string& code) {
    const fs::path path = dir_ / (name + ".py");
    std::ofstream(path) << code;
    WorkerLaunch l;
    l.local_rank = rank;
    l.global_rank = rank;
    l.argv = {"python3", "-u", path.string()};
    l.env = {"PATH=/usr/bin:/bin", "RANK=" + std::to_string(rank)};
    l.err.kind = StreamTarget::Kind::kFile;
    l.err.path = (dir_ / (name + ".err")).string();
    return l;
  }

  // Forks each launch from `z` (never cold: a cold start fails the test).
  ProcessContext::WarmSpawn through(Zygote& z) {
    return [&z](const WorkerLaunch& l, int out, int err) -> std::optional<ChildProcess> {
      ZygoteSpawn req;
      req.target = l.argv.at(2);
      req.orig_argv = l.argv;
      req.env = l.env;
      req.cwd = fs::current_path().string();
      return z.spawn(req, out >= 0 ? out : STDOUT_FILENO, err >= 0 ? err : STDERR_FILENO);
    };
  }

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

TEST_F(ZygoteTest, ReportsWhatItImportedAndWhatItCouldNot) {
  auto z = start({"json", "no_such_module_for_ddprun"});
  ASSERT_FALSE(z->failed()) << z->failure();
  ASSERT_TRUE(z->ready());
  EXPECT_EQ(z->ready()->modules, std::vector<std::string>{"json"});
  ASSERT_EQ(z->ready()->missing.size(), 1u);
  EXPECT_NE(z->ready()->missing[0].find("no_such_module_for_ddprun: ModuleNotFoundError"),
            std::string::npos);
  EXPECT_EQ(z->ready()->threads, 1);
  EXPECT_GT(z->ready()->rss_kb, 0);
}

TEST_F(ZygoteTest, ForkedWorkersReportTheirExitCodesAndSignals) {
  auto z = start();
  ASSERT_TRUE(z->ready()) << z->failure();
  ProcessContext pctx(io_, nullptr, nullptr);
  std::vector<WorkerLaunch> ls;
  ls.push_back(script(0, "exits3", "import sys\nsys.exit(3)\n"));
  ls.push_back(script(1, "killed", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"));
  ls.push_back(script(2, "ends", "x = 1\n"));
  ls.push_back(script(3, "raises", "def f():\n    raise ValueError('planned')\nf()\n"));
  pctx.start(kPython, std::move(ls), {}, through(*z));
  EXPECT_EQ(pctx.warm_started(), 4u);
  run_all(pctx);
  EXPECT_EQ(pctx.exit_of(0)->status, ExitStatus::exited(3));
  EXPECT_EQ(pctx.exit_of(1)->status, ExitStatus::signaled(SIGKILL));
  EXPECT_EQ(pctx.exit_of(2)->status, ExitStatus::exited(0));
  EXPECT_EQ(pctx.exit_of(3)->status, ExitStatus::exited(1));
  const std::string trace = slurp(dir_ / "raises.err");
  EXPECT_NE(trace.find("ValueError: planned"), std::string::npos) << trace;
  EXPECT_NE(trace.find("line 3, in <module>"), std::string::npos) << trace;
  EXPECT_EQ(trace.find("ddprun-zygote"), std::string::npos) << trace;
}

TEST_F(ZygoteTest, WhatAWorkerLeftInItsGroupDiesWithIt) {
  auto z = start();
  ASSERT_TRUE(z->ready()) << z->failure();
  const fs::path pid_file = dir_ / "child.pid";
  ProcessContext pctx(io_, nullptr, nullptr);
  std::vector<WorkerLaunch> ls;
  ls.push_back(script(0, "leaves",
                      "import subprocess\np = subprocess.Popen(['sleep', '1000'])\n"
                      "open('" +
                          pid_file.string() + "', 'w').write(str(p.pid))\n"));
  pctx.start(kPython, std::move(ls), {}, through(*z));
  run_all(pctx);
  EXPECT_EQ(pctx.exit_of(0)->status, ExitStatus::exited(0));
  const pid_t left = std::stoi(slurp(pid_file));
  for (int i = 0; i < 200 && alive(left); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(alive(left));
}

TEST_F(ZygoteTest, AZygoteThatDiesTakesItsWorkersAndFailsTheNextFork) {
  auto z = start();
  ASSERT_TRUE(z->ready()) << z->failure();
  ProcessContext pctx(io_, nullptr, nullptr);
  std::vector<WorkerLaunch> ls;
  ls.push_back(script(0, "sleeps", "import time\ntime.sleep(1000)\n"));
  pctx.start(kPython, std::move(ls), {}, through(*z));
  const pid_t worker = pctx.pid_of(0);
  // Answered once it leads its own session and group: the agent's group signals reach it.
  EXPECT_EQ(::getpgid(worker), worker);
  EXPECT_EQ(::getsid(worker), worker);
  ASSERT_EQ(::kill(z->pid(), SIGKILL), 0);
  run_all(pctx);  // the worker's parent-death signal
  EXPECT_EQ(pctx.exit_of(0)->status, ExitStatus::signaled(SIGKILL));
  EXPECT_FALSE(alive(worker));
  EXPECT_TRUE(z->failed());
  ZygoteSpawn req;
  req.target = (dir_ / "sleeps.py").string();
  req.cwd = "/";
  EXPECT_THROW(z->spawn(req, STDOUT_FILENO, STDERR_FILENO), ZygoteError);
}

}  // namespace
}  // namespace ddprun::agent
