// LaunchConfig: ddprun's command line after parsing and validation, typed: every flag of the
// table (flags.hpp) from the command line, else PET_<FLAG>, else torchrun's own variable for
// it, else what a batch scheduler implies, else the row's default. Pure data; see
// cli_parser.hpp. Both the local launch plan and the fan-out over ssh read it.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/process/std_streams.hpp"
#include "agent/rendezvous/settings.hpp"
#include "launcher/fanout/fanout_config.hpp"

namespace ddprun::launcher {

using Millis = std::chrono::milliseconds;

struct LaunchConfig {
  bool help = false;
  bool version = false;
  std::string print_completion;  // --print-completion SHELL: "bash", "zsh" or "tcsh"

  // Nodes and workers.
  int min_nodes = 1;
  int max_nodes = 1;
  std::string nproc_per_node;  // an integer, or cpu / gpu / auto / xpu (resolved later)

  // Rendezvous.
  agent::Backend rdzv_backend = agent::Backend::kStatic;
  std::string rdzv_backend_spelled;  // as given: "etcd-v2" gets a notice
  std::string rdzv_endpoint;
  std::string rdzv_id;
  std::map<std::string, std::string> rdzv_conf;  // read per backend (multinode_plan.cpp)
  bool standalone = false;
  int node_rank = 0;
  std::string master_addr;
  std::optional<int> master_port;  // unset: a free port on one node (as torchrun 2.x)
  std::string local_addr;

  // Workers' lifecycle.
  int max_restarts = 0;
  double monitor_interval = 0;  // accepted for compatibility: ddprun is event-driven
  std::string start_method;
  std::string event_log_handler;
  std::string role;
  std::string signals_to_handle;  // as given
  std::vector<int> signals;       // parsed
  std::chrono::seconds shutdown_timeout{0};
  bool virtual_local_rank = false;
  bool in_process_recovery = false;       // --in-process-recovery (one node only)
  std::string store_proxy = "auto";       // --store-proxy auto|on|off (several nodes only)
  std::string warm_start;                 // "auto", "on" or "off" (resolved by the plan)
  std::vector<std::string> warm_modules;  // imported by the warm-start zygote
  // --memory-checkpoints: the bound of the job's in-memory checkpoints, in bytes or as a
  // percentage of the node's memory (resolved by the plan); 0 bytes: off.
  struct MemoryLimit {
    uint64_t bytes = 0;
    double percent = 0;  // used when above 0
  };
  MemoryLimit memory_checkpoints{0, 25};

  // Hangs, health and events; a zero duration is off.
  Millis hang_timeout{0};
  Millis hang_start_timeout{0};
  Millis exit_timeout{0};
  std::optional<int> health_port;
  std::string health_host;
  std::string event_log;

  // Entrypoint.
  bool module = false;
  bool no_python = false;
  bool run_path = false;
  std::string entrypoint;
  std::vector<std::string> entrypoint_args;  // verbatim

  // Logs.
  std::string log_dir;
  agent::StdSpec redirects;
  agent::StdSpec tee;
  std::string log_line_prefix_template;
  std::optional<std::set<int>> local_ranks_filter;
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;

  // torchrun's NUMA binding, refused with a message (launch_plan.cpp).
  std::string numa_binding;

  // Canonical names (e.g. "rdzv_backend") of the flags some source gave (not the default).
  std::set<std::string> given;
  // Their values (value flags only), as given: what a launch over ssh forwards to the nodes.
  std::map<std::string, std::string> given_values;

  // Several nodes over ssh: --hosts/--hostfile and friends (launcher/fanout/).
  FanoutConfig fanout;
  // One line each for the log: what the parser derived or ignored.
  std::vector<std::string> notices;
};

}  // namespace ddprun::launcher
