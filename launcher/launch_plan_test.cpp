#include "launcher/launch_plan.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "agent/worker_env.hpp"
#include "launcher/devices.hpp"
#include "launcher/entrypoint.hpp"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;

class LaunchPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ddprun_plan_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "bin");
    write(dir_ / "bin" / "python3", "#!/bin/sh\n", 0755);
    write(dir_ / "bin" / "train", "#!/bin/sh\n", 0755);
    write(dir_ / "script.py", "print(1)\n", 0644);
    write(dir_ / "notexec", "x\n", 0644);
    vars_["PATH"] = (dir_ / "bin").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void write(const fs::path& p, const std::string& text, mode_t mode) {
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
  }
  GetEnv env() const {
    return [this](const std::string& n) -> std::optional<std::string> {
      auto it = vars_.find(n);
      if (it == vars_.end()) return std::nullopt;
      return it->second;
    };
  }
  LaunchPlan plan(std::vector<std::string> args) {
    return make_launch_plan(parse_command_line(args, env()), env(), {"PATH=" + vars_["PATH"]});
  }
  std::string error_of(std::vector<std::string> args) {
    try {
      plan(std::move(args));
    } catch (const CliError& e) {
      return e.what();
    }
    return "<no error>";
  }

  fs::path dir_;
  std::map<std::string, std::string> vars_;
};

TEST_F(LaunchPlanTest, PythonScript) {
  auto p = plan({"--nproc_per_node=2", (dir_ / "script.py").string(), "--lr", "0.1"});
  EXPECT_EQ(p.spec.program, (dir_ / "bin" / "python3").string());
  EXPECT_EQ(p.spec.argv0, "python3");
  EXPECT_EQ(p.spec.args,
            (std::vector<std::string>{"-u", (dir_ / "script.py").string(), "--lr", "0.1"}));
  EXPECT_EQ(p.spec.entrypoint_name, (dir_ / "script.py").string());
  EXPECT_EQ(p.spec.local_world_size, 2);
  EXPECT_EQ(agent::find_env(p.spec.base_env, "OMP_NUM_THREADS"), "1");
  EXPECT_FALSE(p.notices.empty());
}

TEST_F(LaunchPlanTest, PythonExecAndModule) {
  vars_["PYTHON_EXEC"] = (dir_ / "bin" / "train").string();
  auto p = plan({"-m", "pkg.main", "a"});
  EXPECT_EQ(p.spec.program, (dir_ / "bin" / "train").string());
  EXPECT_EQ(p.spec.args, (std::vector<std::string>{"-u", "-m", "pkg.main", "a"}));
  EXPECT_EQ(p.spec.entrypoint_name, "pkg.main");
  EXPECT_FALSE(agent::find_env(p.spec.base_env, "OMP_NUM_THREADS"));  // one worker
}

TEST_F(LaunchPlanTest, ExecutablesAreExecdDirectly) {
  auto p = plan({"train", "--steps", "3"});
  EXPECT_EQ(p.spec.program, (dir_ / "bin" / "train").string());
  EXPECT_EQ(p.spec.argv0, "train");
  EXPECT_EQ(p.spec.args, (std::vector<std::string>{"--steps", "3"}));
  auto q = plan({"--no_python", (dir_ / "bin" / "train").string()});
  EXPECT_EQ(q.spec.program, (dir_ / "bin" / "train").string());
}

TEST_F(LaunchPlanTest, MissingOrNonExecutableEntrypoints) {
  EXPECT_NE(error_of({"nosuchprogram"}).find("not found on PATH"), std::string::npos);
  EXPECT_NE(error_of({(dir_ / "missing.py").string()}).find("does not exist"), std::string::npos);
  EXPECT_NE(error_of({(dir_ / "notexec").string()}).find("not executable"), std::string::npos);
  EXPECT_NE(error_of({"--no_python", (dir_ / "script.py").string()}).find("not executable"),
            std::string::npos);
  vars_["PYTHON_EXEC"] = "/nonexistent/python";
  EXPECT_NE(error_of({(dir_ / "script.py").string()}).find("PYTHON_EXEC"), std::string::npos);
}

TEST_F(LaunchPlanTest, RendezvousChoices) {
  auto standalone = plan({"--standalone", "train"});
  EXPECT_EQ(standalone.rendezvous.port, 0);
  EXPECT_EQ(standalone.rendezvous.master_addr, "localhost");
  EXPECT_EQ(standalone.rendezvous.bind_host, "127.0.0.1");
  EXPECT_EQ(standalone.rendezvous.run_id.size(), 36u);
  auto dflt = plan({"train"});
  EXPECT_EQ(dflt.rendezvous.port, 0);  // torchrun 2.x: no port given on one node
  auto fixed = plan({"--master_addr=10.1.2.3", "--master_port=29511", "train"});
  EXPECT_EQ(fixed.rendezvous.backend, "static");
  EXPECT_EQ(fixed.rendezvous.port, 29511);
  EXPECT_EQ(fixed.rendezvous.master_addr, "10.1.2.3");
  EXPECT_EQ(fixed.rendezvous.bind_host, "0.0.0.0");
  EXPECT_EQ(fixed.rendezvous.run_id, "none");
  auto c10d = plan({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--rdzv_id=j", "train"});
  EXPECT_EQ(c10d.rendezvous.port, 0);
  EXPECT_EQ(c10d.rendezvous.run_id, "j");
}

TEST_F(LaunchPlanTest, MultiNodeIsRefusedNotIgnored) {
  for (auto args : std::vector<std::vector<std::string>>{
           {"--nnodes=2", "train"},
           {"--nnodes=1:4", "train"},
           {"--node_rank=1", "train"},
           {"--rdzv_backend=etcd", "--rdzv_endpoint=h:2379", "train"},
           {"--rdzv_backend=c10d", "--rdzv_endpoint=otherhost:29400", "train"}}) {
    EXPECT_NE(error_of(args).find("not implemented yet in this build"), std::string::npos)
        << args[0];
  }
  EXPECT_NE(error_of({"--run_path", "x.py"}).find("--run-path"), std::string::npos);
}

TEST_F(LaunchPlanTest, GpuCountWithoutGpus) {
  if (cuda_device_count(env()) > 0) GTEST_SKIP() << "this machine has a GPU";
  EXPECT_NE(error_of({"--nproc_per_node=gpu", "train"}).find("no CUDA GPU"), std::string::npos);
  EXPECT_EQ(plan({"--nproc_per_node=cpu", "train"}).spec.local_world_size, usable_cpu_count());
  EXPECT_EQ(plan({"--nproc_per_node=auto", "train"}).spec.local_world_size, usable_cpu_count());
}

TEST_F(LaunchPlanTest, VisibleDeviceEntries) {
  EXPECT_EQ(visible_device_entries("0,1,2"), 3);
  EXPECT_EQ(visible_device_entries("0,-1,2"), 1);
  EXPECT_EQ(visible_device_entries(""), 0);
  EXPECT_EQ(visible_device_entries("GPU-abc,1"), 2);
}

TEST_F(LaunchPlanTest, Endpoints) {
  auto a = parse_endpoint("[::1]:29400", "--x");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 29400);
  auto b = parse_endpoint("host", "--x");
  EXPECT_EQ(b.port, -1);
  EXPECT_THROW(parse_endpoint("host:abc", "--x"), CliError);
}

TEST_F(LaunchPlanTest, LogDirThatIsAFile) {
  EXPECT_NE(error_of({"--log_dir", (dir_ / "script.py").string(), "train"}).find("is a file"),
            std::string::npos);
}

}  // namespace
}  // namespace ddprun::launcher
