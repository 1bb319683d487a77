#include "launcher/multinode_plan.hpp"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

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

using agent::Backend;

// Bit per backend, for the readers table.
constexpr unsigned kStatic = 1, kC10d = 2, kEtcd = 4, kAll = 7;

unsigned bit(Backend b) {
  switch (b) {
    case Backend::kStatic:
      return kStatic;
    case Backend::kC10d:
      return kC10d;
    case Backend::kEtcd:
      return kEtcd;
  }
  return 0;
}

void read_key(const std::string& key, const std::string& value, agent::RendezvousSettings& s,
              std::vector<std::string>& notices) {
  if (key == "join_timeout" || key == "timeout") {
    s.join_timeout = seconds_value(key, value, false);
    s.join_timeout_key = key;
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
  }
}

// The keys, and which backends read them: torchrun's static backend reads timeout; its c10d
// and etcd-v2 backends join_timeout, last_call_timeout, close_timeout, read_timeout, keep-alive,
// is_host and store_type (c10d) and the TLS files (etcd); its old etcd backend timeout.
// close_timeout, read_timeout, the keep-alive, exit_barrier_timeout and token_file are also
// ddprun's own knobs of its static backend, which is built on the same round protocol.
struct Reader {
  std::string_view key;
  unsigned backends;  // 0: torchrun knobs without a counterpart, accepted and unused
};
constexpr Reader kReaders[] = {
    {"join_timeout", kC10d | kEtcd},
    {"timeout", kStatic | kEtcd},
    {"last_call_timeout", kC10d | kEtcd},
    {"close_timeout", kAll},
    {"read_timeout", kAll},
    {"keep_alive_interval", kAll},
    {"keep_alive_max_attempt", kAll},
    {"exit_barrier_timeout", kAll},
    {"is_host", kC10d},
    {"store_type", kC10d},
    {"token_file", kStatic | kC10d},
    {"protocol", kEtcd},
    {"cacert", kEtcd},
    {"ca_cert", kEtcd},
    {"cert", kEtcd},
    {"ssl_cert", kEtcd},
    {"key", kEtcd},
    {"ssl_cert_key", kEtcd},
    {"heartbeat_timeout", 0},
    {"heartbeat", 0},
    {"use_libuv", 0},
    {"rank", 0},
    {"cas_backoff_max_seconds", 0},
    {"etcd_prefix", 0},
};

const Reader* reader_of(const std::string& key) {
  for (const Reader& r : kReaders) {
    if (r.key == key) return &r;
  }
  return nullptr;
}

// Why `key` is not read by `backend`, in the notice's words.
std::string not_read_notice(const std::string& key, Backend backend) {
  const std::string name(agent::backend_name(backend));
  if (key == "is_host") {
    return backend == Backend::kEtcd ? "--rdzv-conf is_host: etcd is the store"
                                     : "--rdzv-conf is_host: ignored by the static backend "
                                       "(node 0 hosts)";
  }
  if (key == "token_file") {
    return "--rdzv-conf token_file: not used with etcd; etcd checks agents with TLS client "
           "certificates (cert=, key=); the workers' store still admits only the round's members";
  }
  if (key == "join_timeout" && backend == Backend::kStatic) {
    return "--rdzv-conf join_timeout: not read by the static backend (as torchrun's, it reads "
           "timeout)";
  }
  if (key == "timeout") {
    return "--rdzv-conf timeout: not read by the " + name +
           " backend (as torchrun's, it reads join_timeout)";
  }
  return "--rdzv-conf " + key + ": not read by the " + name + " backend";
}

}  // namespace

void apply_rdzv_conf(const LaunchConfig& c, agent::RendezvousSettings& s,
                     std::vector<std::string>& notices) {
  const auto& conf = c.rdzv_conf;
  for (const auto& [key, value] : conf) {
    const Reader* r = reader_of(key);
    if (!r) {
      notices.push_back("--rdzv-conf: ignoring unknown key '" + key + "'");
    } else if (r->backends == 0) {
      // torchrun knobs with no counterpart: accepted and unused.
    } else if (!(r->backends & bit(s.backend))) {
      notices.push_back(not_read_notice(key, s.backend));
    } else if (key == "timeout" && conf.count("join_timeout") && s.backend == Backend::kEtcd) {
      // etcd reads both spellings; join_timeout wins.
    } else {
      read_key(key, value, s, notices);
    }
  }
}

agent::RendezvousSettings multi_node_settings(const LaunchConfig& c, const LaunchClass& lc,
                                              std::vector<std::string>& notices) {
  agent::RendezvousSettings s;
  s.backend = c.rdzv_backend;
  s.run_id = c.rdzv_id;
  s.min_nodes = c.min_nodes;
  s.max_nodes = c.max_nodes;
  s.max_restarts = c.max_restarts;
  // auto: where the store's load starts to matter (tests/bench/README.md, the proxy rows) and a
  // script is least likely to use MASTER_ADDR to reach node 0 for its own purposes.
  s.store_proxy =
      c.store_proxy == "on" || (c.store_proxy == "auto" && c.max_nodes >= kStoreProxyNodes);
  s.in_process_recovery = c.in_process_recovery;
  s.local_addr = c.local_addr;
  s.endpoint_host = lc.endpoint.host;
  s.node_rank_hint = c.given.count("node_rank") ? c.node_rank : -1;
  switch (c.rdzv_backend) {
    case Backend::kEtcd:
      if (c.rdzv_backend_spelled == "etcd-v2") {
        notices.push_back(
            "--rdzv-backend=etcd-v2: ddprun speaks etcd's v3 API (served by every etcd since "
            "3.0; 3.6 turned v2 off), so this runs as --rdzv-backend=etcd");
      }
      s.etcd_members = lc.etcd_members;
      s.endpoint_host.clear();
      s.endpoint_port = 0;
      s.is_host = false;  // etcd is the store: no agent hosts one
      break;
    case Backend::kC10d:
      s.endpoint_port = lc.endpoint.port.value_or(agent::kC10dPort);
      break;
    case Backend::kStatic:  // node 0 hosts the store, as torchrun's static backend
      s.endpoint_port = lc.endpoint.port.value_or(agent::kStaticPort);
      s.static_ranks = true;
      s.node_rank_hint = c.node_rank;
      s.is_host = c.node_rank == 0;
      s.join_timeout_key = "timeout";
      break;
  }
  if (c.rdzv_backend != Backend::kStatic && c.rdzv_id == "none") {
    notices.push_back(
        "warning: --rdzv-id is 'none' (the default): another job started with the same "
        "endpoint and id would join this one; give each job its own --rdzv-id");
  }
  // The rendezvous store (when hosted here) listens where the endpoint says; this node's
  // workers' store where the other nodes reach it: the advertised --local-addr.
  bool ipv6 = is_ipv6_literal(s.endpoint_host) || is_ipv6_literal(c.local_addr);
  s.bind_host = bind_address(s.endpoint_host, ipv6);
  s.workers_bind_host = bind_address(c.local_addr, ipv6);
  apply_rdzv_conf(c, s, notices);
  if (s.backend == Backend::kEtcd) {
    if (!s.etcd_tls && (!s.etcd_cacert.empty() || !s.etcd_cert.empty())) {
      s.etcd_tls = true;  // certificates given: TLS, as torchrun's etcd backend does
    }
    if (s.etcd_cert.empty() != s.etcd_key.empty()) {
      throw CliError(
          "--rdzv-conf: give the client certificate and its key together (cert= "
          "and key=)");
    }
  }
  return s;
}

}  // namespace ddprun::launcher
