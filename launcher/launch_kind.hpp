// What kind of launch a command line is, decided once: the rendezvous flags (--standalone,
// --nnodes, --rdzv-backend, --rdzv-endpoint, --node-rank, --master-addr/--master-port,
// --local-addr) are validated here, and --rdzv-endpoint is parsed here and nowhere else.
// The launch plan builds the single-node or the multi-node rendezvous from the result.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/etcd/endpoint.hpp"
#include "launcher/launch_config.hpp"

namespace ddprun::launcher {

enum class LaunchKind {
  kStandalone,        // --standalone: a loopback store on a free port, a UUID run id
  kSingleNodeStatic,  // static, one node: the store at the fixed --master-port or endpoint
                      // port, or (no port given) a loopback store on a free port
  kSingleNodeC10d,    // c10d, at most one node, endpoint empty or loopback: the agent hosts
                      // the store at that port
  kMultiNode,         // c10d with a non-loopback endpoint or more than one node; static with
                      // --nnodes > 1; etcd: the store-backed rendezvous
};

struct Endpoint {
  std::string host;         // without IPv6 brackets; empty: none named
  std::optional<int> port;  // nullopt: none given
};

struct LaunchClass {
  LaunchKind kind = LaunchKind::kStandalone;
  // Where the rendezvous store is (static, c10d): --rdzv-endpoint (c10d; static when given),
  // else --master-addr and --master-port (static). Empty for kStandalone and etcd. Defaults
  // (agent::kC10dPort, agent::kStaticPort) are the plan's, so an unset port stays unset here.
  Endpoint endpoint;
  // etcd: its members, parsed from --rdzv-endpoint here and nowhere else.
  std::vector<etcd::Endpoint> etcd_members;
};

// `config` comes from parse_command_line. Throws CliError (one line) on flags that cannot
// work together.
LaunchClass classify_launch(const LaunchConfig& config);

// "host", "host:port", "[v6]:port", a bare IPv6 address; throws CliError (naming `flag`) when
// malformed. Only classify_launch uses it; declared for the tests.
Endpoint parse_endpoint(const std::string& text, const std::string& flag);

}  // namespace ddprun::launcher
