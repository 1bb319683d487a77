// The multi-node part of the launch plan: the settings of the store-backed rendezvous
// (agent::StoreRendezvous) for a command line classified LaunchKind::kMultiNode
// (launch_kind.hpp), from --nnodes, --rdzv-*, --node-rank, --local-addr and --max-restarts.
#pragma once

#include <string>
#include <vector>

#include "agent/rendezvous/settings.hpp"
#include "launcher/launch_config.hpp"
#include "launcher/launch_kind.hpp"

namespace ddprun::launcher {

// --store-proxy auto turns the proxy on for jobs that may have this many nodes or more.
inline constexpr int kStoreProxyNodes = 32;

// `lc` is classify_launch's (the flags are already validated there). Throws CliError on
// a bad --rdzv-conf value; adds one-line notices (e.g. --rdzv-id none) to `notices`.
agent::RendezvousSettings multi_node_settings(const LaunchConfig& config, const LaunchClass& lc,
                                              std::vector<std::string>& notices);

// --rdzv-conf applied to `settings` for `settings.backend`: each key is read by the backends
// torchrun reads it with (and ddprun's own keys where its implementation uses them); anywhere
// else it gets a notice and is not read, so a value it could not parse is no error there.
// Throws CliError on a bad value of a key that is read.
void apply_rdzv_conf(const LaunchConfig& config, agent::RendezvousSettings& settings,
                     std::vector<std::string>& notices);

}  // namespace ddprun::launcher
