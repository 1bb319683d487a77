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
#include "launcher/launch_kind.hpp"

namespace ddprun::launcher {

struct LaunchPlan {
  agent::WorkerSpec spec;
  LaunchKind kind = LaunchKind::kStandalone;
  agent::LocalRendezvousOptions rendezvous;             // one node (every kind but kMultiNode)
  std::optional<agent::RendezvousSettings> multi_node;  // kMultiNode: the store-backed one
  std::vector<std::string> notices;  // one line each, printed before the workers start
};

// `environ_strings` is the launcher's environment ("NAME=value"), the base of every worker's.
// Throws CliError.
LaunchPlan make_launch_plan(const LaunchConfig& config, const GetEnv& getenv,
                            std::vector<std::string> environ_strings);

}  // namespace ddprun::launcher
