#include "launcher/multinode_plan.hpp"

#include <cmath>
#include <cstdlib>

#include "launcher/bind_hosts.hpp"
#include "launcher/cli_parser.hpp"

namespace ddprun::launcher {
namespace {

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

agent::RendezvousSettings multi_node_settings(const LaunchConfig& c, const Endpoint& endpoint,
                                              std::vector<std::string>& notices) {
  agent::RendezvousSettings s;
  s.backend = c.rdzv_backend;
  s.run_id = c.rdzv_id;
  s.min_nodes = c.min_nodes;
  s.max_nodes = c.max_nodes;
  s.max_restarts = c.max_restarts;
  s.local_addr = c.local_addr;
  s.endpoint_host = endpoint.host;
  if (c.rdzv_backend == "c10d") {
    s.endpoint_port = endpoint.port.value_or(29400);
    s.node_rank_hint = c.given.count("node_rank") ? c.node_rank : -1;
    if (c.rdzv_id == "none") {
      notices.push_back(
          "warning: --rdzv-id is 'none' (the default): another job started with the same "
          "endpoint and id would join this one; give each job its own --rdzv-id");
    }
  } else {  // static: node 0 hosts the store, as torchrun's static backend
    s.endpoint_port = endpoint.port.value_or(29500);
    s.static_ranks = true;
    s.node_rank_hint = c.node_rank;
    s.is_host = c.node_rank == 0;
  }
  // The rendezvous store (when hosted here) listens where the endpoint says; this node's
  // workers' store where the other nodes reach it: the advertised --local-addr.
  bool ipv6 = is_ipv6_literal(endpoint.host) || is_ipv6_literal(c.local_addr);
  s.bind_host = bind_address(endpoint.host, ipv6);
  s.workers_bind_host = bind_address(c.local_addr, ipv6);
  apply_rdzv_conf(c, s, notices);
  if (s.backend == "static" && c.rdzv_conf.count("is_host")) {
    notices.push_back("--rdzv-conf is_host: ignored by the static backend (node 0 hosts)");
    s.is_host = c.node_rank == 0;
  }
  return s;
}

}  // namespace ddprun::launcher
