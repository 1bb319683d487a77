// The multi-node part of the launch plan: which command lines need the store-backed
// rendezvous (agent::StoreRendezvous) and its settings, from --nnodes, --rdzv-*, --node-rank,
// --master-*, --local-addr and --max-restarts. Single-node command lines keep the local
// rendezvous (launch_plan.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/rendezvous/settings.hpp"
#include "launcher/launch_config.hpp"

namespace ddprun::launcher {

// nullopt: one node, local rendezvous. Throws CliError on inconsistent flags; adds one-line
// notices (e.g. --rdzv-id none) to `notices`.
std::optional<agent::RendezvousSettings> multi_node_settings(const LaunchConfig& config,
                                                             std::vector<std::string>& notices);

// --rdzv-conf values applied to `settings`; throws CliError on a bad value.
void apply_rdzv_conf(const LaunchConfig& config, agent::RendezvousSettings& settings,
                     std::vector<std::string>& notices);

}  // namespace ddprun::launcher
