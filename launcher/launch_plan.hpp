// The launch plan: a validated LaunchConfig turned into what the agent runs — the WorkerSpec
// and the rendezvous (the single-node one, or the multi-node settings) — after the checks
// that look at the machine (GPU count, the entrypoint on disk and PATH, the log directory).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/rendezvous/local_rendezvous.hpp"
#include "agent/rendezvous/settings.hpp"
#include "agent/worker_spec.hpp"
#include "launcher/cli_parser.hpp"
#include "launcher/launch_config.hpp"

namespace ddprun::launcher {

struct LaunchPlan {
  agent::WorkerSpec spec;
  agent::LocalRendezvousOptions rendezvous;            // one node
  std::optional<agent::RendezvousSettings> multi_node;  // set: the store-backed rendezvous
  std::vector<std::string> notices;  // one line each, printed before the workers start
};

// `environ_strings` is the launcher's environment ("NAME=value"), the base of every worker's.
// Throws CliError.
LaunchPlan make_launch_plan(const LaunchConfig& config, const GetEnv& getenv,
                            std::vector<std::string> environ_strings);

struct Endpoint {
  std::string host;  // without IPv6 brackets
  int port = -1;     // -1: not given
};
// "host", "host:port", "[v6]:port"; throws CliError (naming `flag`) when malformed.
Endpoint parse_endpoint(const std::string& text, const std::string& flag);

}  // namespace ddprun::launcher
