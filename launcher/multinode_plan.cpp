#include "launcher/multinode_plan.hpp"

#include <cmath>
#include <cstdlib>

#include "launcher/cli_parser.hpp"
#include "launcher/launch_plan.hpp"

namespace ddprun::launcher {
namespace {

bool is_loopback_or_local_name(const std::string& host) {
  return host.empty() || host == "localhost" || host.starts_with("127.") || host == "::1";
}

std::string nnodes_text(const LaunchConfig& c) {
  return c.min_nodes == c.max_nodes
             ? std::to_string(c.max_nodes)
             : std::to_string(c.min_nodes) + ":" + std::to_string(c.max_nodes);
}

agent::Millis seconds_value(const std::string& key, const std::string& value, bool allow_zero) {
  char* end = nullptr;
  double d = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !std::isfinite(d) || d < 0 || (!allow_zero && d == 0) ||
      d > 1e9) {
    throw CliError("--rdzv-conf " + key + "=" + value + ": expected a number of seconds" +
                   (allow_zero ? "" : " above 0"));
  }
  return agent::Millis(static_cast<long long>(std::llround(d * 1000)));
}

bool bool_value(const std::string& key, const std::string& value) {
  std::string v;
  for (char ch : value) v += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (v == "1" || v == "true" || v == "yes" || v == "y" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "n" || v == "off") return false;
  throw CliError("--rdzv-conf " + key + "=" + value + ": expected true or false");
}

std::string bind_for(const std::string& a, const std::string& b) {
  return a.find(':') != std::string::npos || b.find(':') != std::string::npos ? "::" : "0.0.0.0";
}

}  // namespace

void apply_rdzv_conf(const LaunchConfig& c, agent::RendezvousSettings& s,
                     std::vector<std::string>& notices) {
  const auto& conf = c.rdzv_conf;
  for (const auto& [key, value] : conf) {
    if (key == "join_timeout") {
      s.join_timeout = seconds_value(key, value, false);
    } else if (key == "timeout") {  // the static backend's name for it
      if (!conf.count("join_timeout")) s.join_timeout = seconds_value(key, value, false);
    } else if (key == "last_call_timeout") {
      s.last_call_timeout = seconds_value(key, value, true);
    } else if (key == "close_timeout") {
      s.close_timeout = seconds_value(key, value, false);
    } else if (key == "read_timeout") {
      s.read_timeout = seconds_value(key, value, false);
    } else if (key == "keep_alive_interval") {
      s.keep_alive_interval = seconds_value(key, value, false);
    } else if (key == "keep_alive_max_attempt") {
      auto n = parse_int(value);
      if (!n || *n < 1 || *n > 1000) {
        throw CliError("--rdzv-conf keep_alive_max_attempt=" + value + ": expected 1 to 1000");
      }
      s.keep_alive_max_attempt = static_cast<int>(*n);
    } else if (key == "exit_barrier_timeout") {
      s.exit_barrier_timeout = seconds_value(key, value, true);
    } else if (key == "is_host") {
      s.is_host = bool_value(key, value);
    } else if (key == "store_type") {
      if (value != "tcp" && value != "TCPStore") {
        throw CliError("--rdzv-conf store_type=" + value + ": ddprun's rendezvous store is TCP");
      }
    } else if (key == "heartbeat_timeout" || key == "heartbeat" || key == "use_libuv" ||
               key == "rank") {
      // torchrun knobs with no counterpart: accepted and unused.
    } else {
      notices.push_back("--rdzv-conf: ignoring unknown key '" + key + "'");
    }
  }
}

std::optional<agent::RendezvousSettings> multi_node_settings(const LaunchConfig& c,
                                                             std::vector<std::string>& notices) {
  if (c.standalone) {
    if (c.max_nodes > 1) {
      throw CliError("--standalone runs one node; for --nnodes=" + nnodes_text(c) +
                     " use --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT (or the static flags)");
    }
    return std::nullopt;
  }
  if (c.rdzv_backend == "etcd" || c.rdzv_backend == "etcd-v2") {
    throw CliError("the " + c.rdzv_backend +
                   " rendezvous backend is not supported: use --rdzv-backend=c10d, with a "
                   "ddpstore or a ddprun agent hosting the endpoint");
  }
  agent::RendezvousSettings s;
  s.min_nodes = c.min_nodes;
  s.max_nodes = c.max_nodes;
  s.max_restarts = c.max_restarts;
  s.local_addr = c.local_addr;
  if (c.local_addr.find_first_of(" \t\n") != std::string::npos) {
    throw CliError("--local-addr='" + c.local_addr + "': an address has no spaces");
  }
  s.run_id = c.rdzv_id;
  if (c.rdzv_backend == "c10d") {
    Endpoint ep = parse_endpoint(c.rdzv_endpoint, "--rdzv-endpoint");
    if (c.max_nodes == 1 && is_loopback_or_local_name(ep.host)) {
      return std::nullopt;  // one node: the agent hosts the store at that port
    }
    if (ep.host.empty()) {
      throw CliError(
          "--rdzv-backend=c10d with --nnodes=" + nnodes_text(c) +
          " needs --rdzv-endpoint=HOST[:PORT] (the rendezvous store every node reaches)");
    }
    s.backend = "c10d";
    s.endpoint_host = ep.host;
    s.endpoint_port = ep.port < 0 ? 29400 : ep.port;
    s.node_rank_hint = c.given.count("node_rank") ? c.node_rank : -1;
    if (c.rdzv_id == "none") {
      notices.push_back(
          "warning: --rdzv-id is 'none' (the default): another job started with the same "
          "endpoint and id would join this one; give each job its own --rdzv-id");
    }
  } else {  // static
    if (c.max_nodes == 1) {
      if (c.node_rank > 0) {
        throw CliError("--node-rank=" + std::to_string(c.node_rank) +
                       " with --nnodes=1: the only node has rank 0");
      }
      return std::nullopt;
    }
    if (c.min_nodes != c.max_nodes) {
      throw CliError("--nnodes=" + nnodes_text(c) +
                     ": the static backend needs a fixed number of nodes (--nnodes=N); use "
                     "--rdzv-backend=c10d for an elastic range");
    }
    if (c.node_rank >= c.max_nodes) {
      throw CliError("--node-rank=" + std::to_string(c.node_rank) +
                     " with --nnodes=" + std::to_string(c.max_nodes) + ": expected 0 to " +
                     std::to_string(c.max_nodes - 1));
    }
    s.backend = "static";
    if (!c.rdzv_endpoint.empty()) {
      Endpoint ep = parse_endpoint(c.rdzv_endpoint, "--rdzv-endpoint");
      if (ep.port < 0 || ep.host.empty()) {
        throw CliError("--rdzv-endpoint=" + c.rdzv_endpoint +
                       ": the static backend needs HOST:PORT");
      }
      s.endpoint_host = ep.host;
      s.endpoint_port = ep.port;
    } else {
      s.endpoint_host = c.master_addr;
      s.endpoint_port = c.master_port.value_or(29500);
    }
    if (s.endpoint_port == 0) {
      throw CliError("--master-port=0: the nodes of a static job must agree on a fixed port");
    }
    s.static_ranks = true;
    s.node_rank_hint = c.node_rank;
    s.is_host = c.node_rank == 0;  // node 0 hosts the store, as torchrun's static backend
  }
  s.bind_host = bind_for(s.endpoint_host, s.local_addr);
  apply_rdzv_conf(c, s, notices);
  if (s.backend == "static" && c.rdzv_conf.count("is_host")) {
    notices.push_back("--rdzv-conf is_host: ignored by the static backend (node 0 hosts)");
    s.is_host = c.node_rank == 0;
  }
  return s;
}

}  // namespace ddprun::launcher
