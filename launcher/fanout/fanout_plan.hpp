// FanoutPlan: a launch over ssh, decided before anything starts. For every host (node rank =
// position in the host list after --include/--exclude), the ssh command line that runs the
// same ddprun there:
//
//   <ssh-command> <ssh-options> -o BatchMode=yes -o ConnectTimeout=T ... [-p PORT] -- HOST
//     "cd <cwd> && exec env <exports> [CUDA_VISIBLE_DEVICES=..] <ddprun> --stop-on-stdin-eof
//      <the user's flags minus the fan-out ones> --nnodes=N --node-rank=i --local-addr=HOST
//      --master-addr=<first host> --master-port=P [--nproc-per-node=slots] -- <entrypoint> ARGS"
//
// Everything is quoted for the remote shell word by word (shell_words.hpp). Static
// rendezvous by default (the host list fixes the nodes; node 0 hosts the store); with
// --rdzv-backend=c10d/etcd the user's rendezvous flags are forwarded (c10d's endpoint defaults
// to the first host, port 29400). Pure: the machine is reached only through `FanoutInputs`.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "launcher/cli_parser.hpp"
#include "launcher/fanout/env_file.hpp"
#include "launcher/launch_config.hpp"

namespace ddprun::launcher {

struct FanoutInputs {
  GetEnv getenv;
  ReadFile read_file;
  std::string cwd;       // the remote working directory
  std::string self_exe;  // this ddprun's absolute path (the default remote ddprun)
};

struct RemoteNode {
  std::string host;
  int node_rank = 0;
  std::vector<std::string> ssh_argv;    // runs the node's ddprun
  std::vector<std::string> probe_argv;  // checks, before anything starts, that it could
  std::string remote_command;           // the shell line ssh_argv ends with (for messages)
};

// Exit codes of the probe's remote line that say what is missing there.
inline constexpr int kProbeNoDirectory = 3;
inline constexpr int kProbeNoDdprun = 4;

struct FanoutPlan {
  std::vector<RemoteNode> nodes;
  std::string remote_ddprun;
  std::string cwd;
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds shutdown_timeout{30000};  // the nodes' grace before SIGKILL
  std::chrono::milliseconds close_timeout{30000};     // the store host's wait for goodbyes
  std::vector<std::string> notices;                   // printed once the plan is made
};

// Throws CliError for every bad combination (exit 2, nothing started).
FanoutPlan make_fanout_plan(const LaunchConfig& config, const FanoutInputs& in);

// The inputs of this process: its environment, the file system, getcwd, /proc/self/exe.
FanoutInputs this_process_inputs(GetEnv getenv);

}  // namespace ddprun::launcher
