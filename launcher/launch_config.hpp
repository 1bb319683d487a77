// LaunchConfig: ddprun's command line after parsing and validation (flags from the command
// line, else from PET_<FLAG>, else torchrun's defaults). Pure data; see cli_parser.hpp.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/process/std_streams.hpp"
#include "launcher/fanout/fanout_config.hpp"

namespace ddprun::launcher {

struct LaunchConfig {
  bool help = false;
  bool version = false;

  // Nodes and workers.
  int min_nodes = 1;
  int max_nodes = 1;
  std::string nproc_per_node = "1";  // an integer, or cpu / gpu / auto / xpu (resolved later)

  // Rendezvous.
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_id = "none";
  std::map<std::string, std::string> rdzv_conf;
  bool standalone = false;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  std::optional<int> master_port;  // unset: a free port on one node (as torchrun 2.x)
  std::string local_addr;

  // Workers' lifecycle.
  int max_restarts = 0;
  double monitor_interval = 0.1;  // accepted for compatibility: ddprun is event-driven
  std::string start_method = "spawn";
  std::string event_log_handler = "null";
  std::string role = "default";
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::vector<int> signals;             // parsed signals_to_handle
  std::optional<int> shutdown_timeout;  // seconds; unset: $TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30
  bool virtual_local_rank = false;

  // Hangs, health and events.
  double hang_timeout = 0;        // seconds; 0: off
  double hang_start_timeout = 0;  // seconds; 0: off
  double exit_timeout = 300;      // seconds; 0: off
  std::optional<int> health_port;
  std::string health_host = "127.0.0.1";
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

  // Flags torchrun has that ddprun refuses with a message (see launch_plan.cpp).
  std::string logs_specs;
  std::string numa_binding;

  // Canonical names (e.g. "rdzv_backend") of the flags given on the command line or by PET_*.
  std::set<std::string> given;
  // Their values (value flags only), as given: what a launch over ssh forwards to the nodes.
  std::map<std::string, std::string> given_values;

  // Several nodes over ssh: --hosts/--hostfile and friends (launcher/fanout/).
  FanoutConfig fanout;
  // One line each for the log: what the parser derived from a scheduler's variables.
  std::vector<std::string> notices;
};

}  // namespace ddprun::launcher
