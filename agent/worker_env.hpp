// The environment of one worker, exactly as torchrun builds it (agent/ENVIRONMENT.md):
// the launcher's environment plus LOCAL_RANK, RANK, GROUP_RANK, ROLE_RANK, ROLE_NAME,
// LOCAL_WORLD_SIZE, WORLD_SIZE, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_{RESTART_COUNT,MAX_RESTARTS,RUN_ID,USE_AGENT_STORE,ERROR_FILE,
// SIGNALS_TO_HANDLE}, TORCH_NCCL_ASYNC_ERROR_HANDLING (torch 2.x) and
// NCCL_ASYNC_ERROR_HANDLING (torch 1.13) — the parent's value, else 1 — and, with
// --virtual-local-rank, LOCAL_RANK=0 and one device in CUDA_VISIBLE_DEVICES.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/worker_group.hpp"

namespace ddprun::agent {

// "NAME=value" strings, ready for execve. `flight_recorder_dir` (empty: none) becomes
// DDPRUN_FLIGHT_RECORDER and, unless the user set one, torch's TORCH_FR_DUMP_TEMP_FILE;
// `recovery_dir` (empty: none) DDPRUN_RECOVERY_DIR (in_process_recovery.hpp).
std::vector<std::string> build_worker_env(const WorkerGroup& group, const Worker& worker,
                                          const std::string& error_file,
                                          const std::string& flight_recorder_dir = "",
                                          const std::string& recovery_dir = "");

// The value of NAME in a "NAME=value" list.
std::optional<std::string_view> find_env(const std::vector<std::string>& env,
                                         std::string_view name);

// The device list a worker sees with --virtual-local-rank: entry `local_rank` of the parent's
// CUDA_VISIBLE_DEVICES (or HIP_VISIBLE_DEVICES), else the local rank itself. nullopt if the
// parent's list is too short.
std::optional<std::string> virtual_device(const std::vector<std::string>& env, int local_rank);

}  // namespace ddprun::agent
