// WorkerSpec: what the agent runs on this node (after torchelastic's WorkerSpec). Built once by
// the launcher from the command line; immutable while the agent runs.
#pragma once

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/process/std_streams.hpp"

namespace ddprun::agent {

struct WorkerSpec {
  std::string role = "default";  // ROLE_NAME and the console prefix
  int local_world_size = 1;      // workers on this node (--nproc-per-node)

  // The worker command. `program` is the resolved path passed to execve; `args` follows it
  // (argv[1..]) and may contain ${local_rank}, substituted per worker like torchrun does.
  std::string program;
  std::string argv0;  // argv[0] as the user would see it (e.g. "python3", "./train")
  std::vector<std::string> args;
  std::string entrypoint_name;  // title of the failure summary: script, module or program

  std::chrono::milliseconds shutdown_timeout{std::chrono::seconds(30)};
  std::vector<int> signals_to_handle;  // forwarded to the workers' process groups
  std::string signals_to_handle_text;  // TORCHELASTIC_SIGNALS_TO_HANDLE, as given

  // Logs: <log_dir>/<run_id>_<random>/attempt_<N>/<local_rank>/{stdout,stderr}.log + error.json.
  std::string log_dir;  // empty: a fresh temporary directory, removed after a clean run
  StdSpec redirects;    // to files only
  StdSpec tee;          // to files and to the console, with a line prefix
  std::optional<std::set<int>> local_ranks_filter;    // console output only from these ranks
  std::string log_line_prefix_template;               // empty: "[${role_name}${local_rank}]:"
  std::vector<std::string> duplicate_stdout_filters;  // tee'd lines also to filtered_stdout.log
  std::vector<std::string> duplicate_stderr_filters;

  bool virtual_local_rank = false;  // LOCAL_RANK=0, one device in CUDA_VISIBLE_DEVICES

  // The environment every worker starts from (the launcher's, plus OMP_NUM_THREADS), as
  // "NAME=value" strings; the agent adds torchrun's variables on top.
  std::vector<std::string> base_env;
};

}  // namespace ddprun::agent
