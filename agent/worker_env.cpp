#include "agent/worker_env.hpp"

#include <map>

namespace ddprun::agent {

std::optional<std::string_view> find_env(const std::vector<std::string>& env,
                                         std::string_view name) {
  for (const auto& kv : env) {
    if (kv.size() > name.size() && kv[name.size()] == '=' &&
        kv.compare(0, name.size(), name) == 0) {
      return std::string_view(kv).substr(name.size() + 1);
    }
  }
  return std::nullopt;
}

std::optional<std::string> virtual_device(const std::vector<std::string>& env, int local_rank) {
  auto parent = find_env(env, "HIP_VISIBLE_DEVICES");
  if (!parent || parent->empty()) parent = find_env(env, "CUDA_VISIBLE_DEVICES");
  if (!parent) return std::to_string(local_rank);
  std::string_view list = *parent;
  for (int i = 0;; ++i) {
    size_t comma = list.find(',');
    if (i == local_rank) {
      std::string_view item = list.substr(0, comma);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
      return std::string(item);
    }
    if (comma == std::string_view::npos) return std::nullopt;
    list.remove_prefix(comma + 1);
  }
}

std::vector<std::string> build_worker_env(const WorkerGroup& group, const Worker& worker,
                                          const std::string& error_file,
                                          const std::string& flight_recorder_dir,
                                          const std::string& recovery_dir) {
  const WorkerSpec& spec = group.spec();
  const RendezvousInfo& round = group.round();
  const auto& base = spec.base_env;
  std::map<std::string, std::string> set;
  set["LOCAL_RANK"] = spec.virtual_local_rank ? "0" : std::to_string(worker.local_rank);
  set["RANK"] = std::to_string(worker.global_rank);
  set["GROUP_RANK"] = std::to_string(round.group_rank);
  set["ROLE_RANK"] = std::to_string(worker.role_rank);
  set["ROLE_NAME"] = spec.role;
  set["LOCAL_WORLD_SIZE"] = std::to_string(spec.local_world_size);
  set["WORLD_SIZE"] = std::to_string(worker.world_size);
  set["GROUP_WORLD_SIZE"] = std::to_string(round.group_world_size);
  set["ROLE_WORLD_SIZE"] = std::to_string(worker.role_world_size);
  set["MASTER_ADDR"] = round.master_addr;
  set["MASTER_PORT"] = std::to_string(round.master_port);
  set["TORCHELASTIC_RESTART_COUNT"] = std::to_string(round.restart_count);
  set["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(round.max_restarts);
  set["TORCHELASTIC_RUN_ID"] = group.run_id();
  set["TORCHELASTIC_USE_AGENT_STORE"] = round.use_agent_store ? "True" : "False";
  set["TORCHELASTIC_ERROR_FILE"] = error_file;
  set["TORCHELASTIC_SIGNALS_TO_HANDLE"] = spec.signals_to_handle_text;
  if (!group.endpoints().heartbeat_socket.empty()) {
    set["DDPRUN_HEARTBEAT_SOCKET"] = group.endpoints().heartbeat_socket;
  }
  if (!group.endpoints().memory_checkpoint_dir.empty()) {
    set["DDPRUN_MEMORY_CHECKPOINT_DIR"] = group.endpoints().memory_checkpoint_dir;
    set["DDPRUN_MEMORY_CHECKPOINT_LIMIT"] =
        std::to_string(group.endpoints().memory_checkpoint_limit);
  }
  if (!group.endpoints().timer_file.empty()) {
    set["TORCHELASTIC_TIMER_FILE"] = group.endpoints().timer_file;
  }
  if (!flight_recorder_dir.empty()) {
    set["DDPRUN_FLIGHT_RECORDER"] = flight_recorder_dir;
    // torch's own dumps (a collective's timeout on NCCL, _dump_fr_trace_file) beside ours,
    // unless the user chose a place under either of torch's names.
    if (!find_env(base, "TORCH_FR_DUMP_TEMP_FILE") &&
        !find_env(base, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")) {
      set["TORCH_FR_DUMP_TEMP_FILE"] = flight_recorder_dir + "/rank_";
    }
  }
  if (!recovery_dir.empty()) set["DDPRUN_RECOVERY_DIR"] = recovery_dir;
  for (const char* name : {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"}) {
    auto parent = find_env(base, name);
    set[name] = parent ? std::string(*parent) : "1";
  }
  if (spec.virtual_local_rank) {
    auto device = virtual_device(base, worker.local_rank);
    set["CUDA_VISIBLE_DEVICES"] = device.value_or(std::to_string(worker.local_rank));
    if (auto hip = find_env(base, "HIP_VISIBLE_DEVICES"); hip && !hip->empty()) {
      set["HIP_VISIBLE_DEVICES"] = set["CUDA_VISIBLE_DEVICES"];
    }
  }

  std::vector<std::string> env;
  env.reserve(base.size() + set.size());
  for (const auto& kv : base) {
    size_t eq = kv.find('=');
    if (eq != std::string::npos && set.count(kv.substr(0, eq))) continue;
    env.push_back(kv);
  }
  for (auto& [name, value] : set) env.push_back(name + "=" + value);
  return env;
}

}  // namespace ddprun::agent
