#include "agent/worker_env.hpp"

#include <gtest/gtest.h>

namespace ddprun::agent {
namespace {

struct Fixture {
  WorkerSpec spec;
  std::unique_ptr<WorkerGroup> group;
  Fixture(std::vector<std::string> base) {
    spec.local_world_size = 2;
    spec.signals_to_handle_text = "SIGTERM,SIGINT";
    spec.base_env = std::move(base);
    group = std::make_unique<WorkerGroup>(spec, "job");
    RendezvousInfo round;
    round.master_addr = "localhost";
    round.master_port = 4321;
    round.restart_count = 1;
    round.max_restarts = 3;
    round.world_size = 2;
    group->assign(round);
  }
};

TEST(WorkerEnv, TorchrunVariables) {
  Fixture f({"PATH=/bin", "RANK=99", "OMP_NUM_THREADS=1"});
  auto env = build_worker_env(*f.group, f.group->workers()[1], "/logs/attempt_1/1/error.json");
  auto get = [&](const char* n) { return std::string(find_env(env, n).value_or("<unset>")); };
  EXPECT_EQ(get("PATH"), "/bin");
  EXPECT_EQ(get("RANK"), "1");
  EXPECT_EQ(get("LOCAL_RANK"), "1");
  EXPECT_EQ(get("GROUP_RANK"), "0");
  EXPECT_EQ(get("ROLE_RANK"), "1");
  EXPECT_EQ(get("ROLE_NAME"), "default");
  EXPECT_EQ(get("LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(get("WORLD_SIZE"), "2");
  EXPECT_EQ(get("GROUP_WORLD_SIZE"), "1");
  EXPECT_EQ(get("ROLE_WORLD_SIZE"), "2");
  EXPECT_EQ(get("MASTER_ADDR"), "localhost");
  EXPECT_EQ(get("MASTER_PORT"), "4321");
  EXPECT_EQ(get("TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(get("TORCHELASTIC_MAX_RESTARTS"), "3");
  EXPECT_EQ(get("TORCHELASTIC_RUN_ID"), "job");
  EXPECT_EQ(get("TORCHELASTIC_USE_AGENT_STORE"), "True");
  EXPECT_EQ(get("TORCHELASTIC_ERROR_FILE"), "/logs/attempt_1/1/error.json");
  EXPECT_EQ(get("TORCHELASTIC_SIGNALS_TO_HANDLE"), "SIGTERM,SIGINT");
  EXPECT_EQ(get("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
  EXPECT_EQ(get("NCCL_ASYNC_ERROR_HANDLING"), "1");
  EXPECT_EQ(get("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(get("CUDA_VISIBLE_DEVICES"), "<unset>");
  int ranks = 0;
  for (const auto& kv : env) ranks += kv.starts_with("RANK=");
  EXPECT_EQ(ranks, 1);  // the parent's RANK is replaced, not duplicated
}

TEST(WorkerEnv, KeepsParentsNcclSetting) {
  Fixture f({"NCCL_ASYNC_ERROR_HANDLING=0"});
  auto env = build_worker_env(*f.group, f.group->workers()[0], "e");
  EXPECT_EQ(find_env(env, "NCCL_ASYNC_ERROR_HANDLING"), "0");
  EXPECT_EQ(find_env(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
}

TEST(WorkerEnv, VirtualLocalRank) {
  Fixture f({"CUDA_VISIBLE_DEVICES=4, 5"});
  f.spec.virtual_local_rank = true;
  auto env = build_worker_env(*f.group, f.group->workers()[1], "e");
  EXPECT_EQ(find_env(env, "LOCAL_RANK"), "0");
  EXPECT_EQ(find_env(env, "CUDA_VISIBLE_DEVICES"), "5");
  EXPECT_EQ(virtual_device({}, 3), "3");
  EXPECT_FALSE(virtual_device({"CUDA_VISIBLE_DEVICES=0"}, 1));
}

}  // namespace
}  // namespace ddprun::agent
