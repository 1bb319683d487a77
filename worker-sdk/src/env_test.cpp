#include "ddprun/env.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace ddprun {
namespace {

using ::testing::HasSubstr;

EnvLookup lookup_of(std::map<std::string, std::string> vars) {
  return [vars](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::map<std::string, std::string> torchrun_env() {
  return {{"RANK", "1"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "0"},
          {"MASTER_ADDR", "localhost"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_MAX_RESTARTS", "3"},
          {"TORCHELASTIC_RUN_ID", "job7"},
          {"TORCHELASTIC_ERROR_FILE", "/tmp/x/error.json"}};
}

std::string error_of(std::map<std::string, std::string> vars) {
  try {
    read_worker_env(lookup_of(std::move(vars)));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(WorkerEnv, ReadsTorchrunContract) {
  WorkerEnv w = read_worker_env(lookup_of(torchrun_env()));
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 2);
  EXPECT_EQ(w.master_addr, "localhost");
  EXPECT_EQ(w.master_port, 29500);
  EXPECT_TRUE(w.use_agent_store);
  EXPECT_EQ(w.restart_count, 2);
  EXPECT_EQ(w.max_restarts, 3);
  EXPECT_EQ(w.run_id, "job7");
  EXPECT_EQ(w.error_file, "/tmp/x/error.json");
}

TEST(WorkerEnv, OptionalVariablesDefault) {
  WorkerEnv w = read_worker_env(lookup_of({{"RANK", "0"},
                                           {"WORLD_SIZE", "3"},
                                           {"LOCAL_RANK", "0"},
                                           {"MASTER_ADDR", "10.0.0.1"},
                                           {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(w.local_world_size, 3);
  EXPECT_FALSE(w.use_agent_store);
  EXPECT_EQ(w.restart_count, 0);
  EXPECT_TRUE(w.error_file.empty());
}

TEST(WorkerEnv, MissingVariableIsNamed) {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    auto env = torchrun_env();
    env.erase(name);
    EXPECT_THAT(error_of(env), HasSubstr(std::string(name) + " is not set")) << name;
  }
}

TEST(WorkerEnv, MalformedVariableIsNamed) {
  auto env = torchrun_env();
  env["WORLD_SIZE"] = "four";
  EXPECT_THAT(error_of(env), HasSubstr("WORLD_SIZE=\"four\" is not an integer"));
  env = torchrun_env();
  env["MASTER_PORT"] = "70000";
  EXPECT_THAT(error_of(env), HasSubstr("MASTER_PORT=70000 is out of range"));
  env = torchrun_env();
  env["LOCAL_RANK"] = "1x";
  EXPECT_THAT(error_of(env), HasSubstr("LOCAL_RANK=\"1x\" is not an integer"));
  env = torchrun_env();
  env["MASTER_ADDR"] = "  ";
  EXPECT_THAT(error_of(env), HasSubstr("MASTER_ADDR is empty"));
}

TEST(WorkerEnv, RanksMustBeInRange) {
  auto env = torchrun_env();
  env["RANK"] = "4";
  EXPECT_THAT(error_of(env), HasSubstr("RANK=4 is not below WORLD_SIZE=4"));
  env = torchrun_env();
  env["LOCAL_RANK"] = "2";
  EXPECT_THAT(error_of(env), HasSubstr("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  env = torchrun_env();
  env["RANK"] = "-1";
  EXPECT_THAT(error_of(env), HasSubstr("RANK=-1 is out of range"));
}

TEST(WorkerEnv, AgentStoreNeedsRestartCount) {
  auto env = torchrun_env();
  env.erase("TORCHELASTIC_RESTART_COUNT");
  EXPECT_THAT(error_of(env), HasSubstr("TORCHELASTIC_RESTART_COUNT is not set"));
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(error_of(env), "");
}

}  // namespace
}  // namespace ddprun
