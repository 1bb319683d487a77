// Settings of a multi-node rendezvous: the node range, torchrun's --rdzv-conf timeouts, and
// where the rendezvous store is. Built once by the launcher; immutable afterwards.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/etcd/endpoint.hpp"

namespace ddprun::agent {

using Millis = std::chrono::milliseconds;

// Where the nodes agree: node 0's store at fixed ranks (static), a c10d store (elastic), etcd.
enum class Backend { kStatic, kC10d, kEtcd };
// "static", "c10d", "etcd", as log lines name it.
std::string_view backend_name(Backend backend);

// The rendezvous store's port when the endpoint names none, as torchrun's.
constexpr int kC10dPort = 29400;
constexpr int kStaticPort = 29500;

struct RendezvousSettings {
  Backend backend = Backend::kC10d;
  std::string run_id = "none";  // --rdzv-id: namespaces the job's keys in the store
  int min_nodes = 1;
  int max_nodes = 1;
  // Static backend: node ranks are exactly the --node-rank of each node (min = max = N).
  bool static_ranks = false;

  // --rdzv-conf (torchrun's keys and defaults; values in seconds, fractions allowed).
  Millis join_timeout{std::chrono::seconds(600)};      // reaching min nodes, and connecting
  std::string join_timeout_key = "join_timeout";       // its --rdzv-conf key ("timeout": static)
  Millis last_call_timeout{std::chrono::seconds(30)};  // extra wait for more nodes after min
  Millis close_timeout{std::chrono::seconds(30)};      // stragglers of a closed round, bye
  Millis read_timeout{std::chrono::seconds(60)};       // one store request
  Millis keep_alive_interval{std::chrono::seconds(5)};
  int keep_alive_max_attempt = 3;  // a silent peer is dead after interval x attempts
  Millis exit_barrier_timeout{std::chrono::seconds(300)};

  // The rendezvous store (static, c10d).
  std::string endpoint_host;  // as given (no brackets)
  int endpoint_port = kC10dPort;
  // Host the store in this agent: true/false forced (static node 0; --rdzv-conf is_host=),
  // nullopt = torchrun's rule (the endpoint names this machine), falling back to being a
  // client when the port is taken.
  std::optional<bool> is_host;
  // Where the stores this agent hosts listen: the rendezvous store (when hosted here) and
  // this node's workers' store (used when this node is rank 0 of a round). A specific
  // address when the user named one, the wildcard ("0.0.0.0", "::") only when needed.
  std::string bind_host = "0.0.0.0";
  std::string workers_bind_host = "0.0.0.0";
  // --rdzv-conf token_file=: the rendezvous store's secret (store::ServerOptions::token), for
  // the store this agent hosts and for its connections to it. Empty = open (a warning when
  // the hosted store listens beyond loopback).
  std::string token;

  // etcd: its members as --rdzv-endpoint lists them, and TLS (--rdzv-conf protocol=https,
  // cacert=, cert=, key=).
  std::vector<etcd::Endpoint> etcd_members;
  bool etcd_tls = false;
  std::string etcd_cacert, etcd_cert, etcd_key;

  // This node.
  std::string local_addr;  // advertised address; empty = the host name
  int node_rank_hint = -1;
  int max_restarts = 0;  // this node's --max-restarts (the job uses the first node's)
  // --store-proxy: this node's workers reach the round's workers' store through a proxy in
  // this agent (store/proxy.hpp): MASTER_ADDR=127.0.0.1, MASTER_PORT=the proxy's port.
  bool store_proxy = false;
  // --in-process-recovery: a third client watches for other nodes' recoveries, and the round's
  // restart count includes the recoveries that spent one without ending the round.
  bool in_process_recovery = false;
};

}  // namespace ddprun::agent
