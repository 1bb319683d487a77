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

  // Hangs (agent/hang/, docs/hangs-health-events.md). A worker that has beaten once and then sends
  // no heartbeat for hang_timeout is hung; one that sends no first beat within hang_start_timeout
  // of its start too. 0: off.
  std::chrono::milliseconds hang_timeout{0};
  std::chrono::milliseconds hang_start_timeout{0};
  // torch's FileTimer protocol (TORCHELASTIC_ENABLE_FILE_TIMER=1): served on `timer_file`
  // (the user's TORCHELASTIC_TIMER_FILE) or on a fresh path when that is empty.
  bool file_timer = false;
  std::string timer_file;
  // After a worker exited 0, the others of this node must exit within exit_timeout, else
  // their stacks are captured and they are stopped (the job's work is done). 0: off.
  std::chrono::milliseconds exit_timeout{std::chrono::seconds(300)};
  std::chrono::milliseconds stack_timeout{std::chrono::seconds(10)};  // per stack tool
  // --health-port / --health-host (agent/health/): no server without a port.
  std::optional<int> health_port;
  std::string health_host = "127.0.0.1";
  std::string event_log;  // --event-log: JSON lines; empty: none

  // Warm start (process/zygote.hpp, agent/warm_start.hpp): a Python entrypoint's workers are
  // forked from a zygote that imported `warm_modules`, once it is ready; before that, and for
  // anything else, they start cold. `python` says where the script or module sits in the
  // worker's argv (argv[target]; -m before it for a module); unset: not a Python entrypoint.
  struct PythonEntry {
    bool module = false;
    size_t target = 0;
  };
  std::optional<PythonEntry> python;
  bool warm_start = false;
  std::vector<std::string> warm_modules;

  // In-process recovery (in_process_recovery.hpp): a failed worker is replaced alone when the
  // others (on every node) run the worker SDK's TrainingLoop.
  bool in_process_recovery = false;
  // ... with a standby worker for a binary entrypoint (process/standby.hpp); off only where
  // the entrypoint cannot wait for one (agent_loop_test's /bin/sh).
  bool recovery_standby = true;

  // In-memory checkpoints (memory_checkpoints.hpp): their bound, in bytes, or as a percentage
  // of the node's memory when that is above 0; neither: off.
  uint64_t memory_checkpoint_bytes = 0;
  double memory_checkpoint_percent = 0;

  // The environment every worker starts from (the launcher's, plus OMP_NUM_THREADS), as
  // "NAME=value" strings; the agent adds torchrun's variables on top.
  std::vector<std::string> base_env;
};

}  // namespace ddprun::agent
