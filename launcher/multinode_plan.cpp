#include "launcher/multinode_plan.hpp"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>

#include "launcher/bind_hosts.hpp"
#include "launcher/cli_parser.hpp"
#include "store/sys/token_file.hpp"

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

// A TLS file etcd's connection will need: checked now, so a typo is a usage error.
std::string readable_file(const std::string& key, const std::string& path) {
  if (path.empty() || ::access(path.c_str(), R_OK) != 0) {
    throw CliError("--rdzv-conf " + key + "=" + path + ": " +
                   (path.empty() ? std::string("expected a file") : std::strerror(errno)));
  }
  return path;
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
    } else if (key == "token_file") {
      sys::TokenFile file = sys::read_token_file(value);
      if (!file.error.empty()) throw CliError("--rdzv-conf token_file: " + file.error);
      if (!file.warning.empty()) notices.push_back(file.warning);
      s.token = std::move(file.token);
    } else if (key == "protocol") {
      if (value != "http" && value != "https") {
        throw CliError("--rdzv-conf protocol=" + value + ": expected http or https");
      }
      s.etcd_tls = value == "https";
    } else if (key == "cacert" || key == "ca_cert") {
      s.etcd_cacert = readable_file(key, value);
    } else if (key == "cert" || key == "ssl_cert") {
      s.etcd_cert = readable_file(key, value);
    } else if (key == "key" || key == "ssl_cert_key") {
      s.etcd_key = readable_file(key, value);
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
  if (c.rdzv_backend.starts_with("etcd")) {
    // etcd-v2 and etcd-v3 name the same backend: ddprun speaks the v3 API.
    if (c.rdzv_backend == "etcd-v2") {
      notices.push_back(
          "--rdzv-backend=etcd-v2: ddprun speaks etcd's v3 API (served by every etcd since "
          "3.0; 3.6 turned v2 off), so this runs as --rdzv-backend=etcd");
    }
    s.backend = "etcd";
    s.etcd_endpoints = endpoint.host;
    s.endpoint_host.clear();
    s.endpoint_port = 0;
    s.is_host = false;  // etcd is the store: no agent hosts one
    s.node_rank_hint = c.given.count("node_rank") ? c.node_rank : -1;
  }
  if (c.rdzv_backend == "c10d" || c.rdzv_backend.starts_with("etcd")) {
    if (s.backend == "c10d") {
      s.endpoint_port = endpoint.port.value_or(29400);
      s.node_rank_hint = c.given.count("node_rank") ? c.node_rank : -1;
    }
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
  bool ipv6 = is_ipv6_literal(s.endpoint_host) || is_ipv6_literal(c.local_addr);
  s.bind_host = bind_address(s.endpoint_host, ipv6);
  s.workers_bind_host = bind_address(c.local_addr, ipv6);
  apply_rdzv_conf(c, s, notices);
  if (s.backend != "etcd") {
    for (const char* key : {"protocol", "cacert", "ca_cert", "cert", "ssl_cert", "key",
                            "ssl_cert_key"}) {
      if (c.rdzv_conf.count(key)) {
        notices.push_back(std::string("--rdzv-conf ") + key + ": only the etcd backend uses it");
      }
    }
  } else {
    if (c.rdzv_conf.count("is_host")) notices.push_back("--rdzv-conf is_host: etcd is the store");
    if (c.rdzv_conf.count("token_file")) {
      notices.push_back("--rdzv-conf token_file: not used with etcd; etcd checks agents with TLS "
                        "client certificates (cert=, key=); the workers' store still admits "
                        "only the round's members");
      s.token.clear();
    }
    s.is_host = false;
    if (!s.etcd_tls && (!s.etcd_cacert.empty() || !s.etcd_cert.empty())) {
      s.etcd_tls = true;  // certificates given: TLS, as torchrun's etcd backend does
    }
    if (s.etcd_cert.empty() != s.etcd_key.empty()) {
      throw CliError("--rdzv-conf: give the client certificate and its key together (cert= "
                     "and key=)");
    }
  }
  if (s.backend == "static" && c.rdzv_conf.count("is_host")) {
    notices.push_back("--rdzv-conf is_host: ignored by the static backend (node 0 hosts)");
    s.is_host = c.node_rank == 0;
  }
  return s;
}

}  // namespace ddprun::launcher
