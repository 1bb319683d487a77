#include "launcher/launch_kind.hpp"

#include <stdexcept>

#include "agent/etcd/endpoint.hpp"
#include "launcher/bind_hosts.hpp"
#include "launcher/cli_parser.hpp"
#include "store/sys/net.hpp"

namespace ddprun::launcher {
namespace {

std::string nnodes_text(const LaunchConfig& c) {
  return c.min_nodes == c.max_nodes
             ? std::to_string(c.max_nodes)
             : std::to_string(c.min_nodes) + ":" + std::to_string(c.max_nodes);
}

LaunchClass classify_c10d(const LaunchConfig& c) {
  Endpoint ep = parse_endpoint(c.rdzv_endpoint, "--rdzv-endpoint");
  if (c.max_nodes == 1 && (ep.host.empty() || sys::is_loopback(ep.host))) {
    return {LaunchKind::kSingleNodeC10d, ep, {}};  // the agent hosts the store at that port
  }
  if (ep.host.empty()) {
    throw CliError("--rdzv-backend=c10d with --nnodes=" + nnodes_text(c) +
                   " needs --rdzv-endpoint=HOST[:PORT] (the rendezvous store every node reaches)");
  }
  if (ep.port == 0) {
    throw CliError("--rdzv-endpoint=" + c.rdzv_endpoint +
                   ": the nodes must agree on a fixed port (0 picks a different one on each)");
  }
  return {LaunchKind::kMultiNode, ep, {}};
}

// etcd: always the multi-node rendezvous (one node too: the job is etcd's to see); the
// endpoint is a list of members, checked here and kept as text.
LaunchClass classify_etcd(const LaunchConfig& c) {
  if (c.rdzv_endpoint.empty()) {
    throw CliError("--rdzv-backend=" + c.rdzv_backend_spelled +
                   " needs --rdzv-endpoint=HOST[:PORT][,HOST[:PORT]...] (etcd's client URLs; "
                   "port 2379 by default)");
  }
  LaunchClass lc{LaunchKind::kMultiNode, {}, {}};
  try {
    lc.etcd_members = etcd::parse_endpoints(c.rdzv_endpoint);
  } catch (const std::invalid_argument& e) {
    throw CliError("--rdzv-endpoint=" + c.rdzv_endpoint + ": " + e.what());
  }
  return lc;
}

// Static: --rdzv-endpoint overrides --master-addr/--master-port, as in torchrun.
Endpoint static_endpoint(const LaunchConfig& c) {
  if (c.rdzv_endpoint.empty()) return {c.master_addr, c.master_port};
  Endpoint ep = parse_endpoint(c.rdzv_endpoint, "--rdzv-endpoint");
  if (!ep.port || ep.host.empty()) {
    throw CliError("--rdzv-endpoint=" + c.rdzv_endpoint + ": the static backend needs HOST:PORT");
  }
  return ep;
}

LaunchClass classify_static(const LaunchConfig& c) {
  if (c.max_nodes == 1) {
    if (c.node_rank > 0) {
      throw CliError("--node-rank=" + std::to_string(c.node_rank) +
                     " with --nnodes=1: the only node has rank 0");
    }
    return {LaunchKind::kSingleNodeStatic, static_endpoint(c), {}};
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
  Endpoint ep = static_endpoint(c);
  if (ep.port == 0) {
    throw CliError("--master-port=0: the nodes of a static job must agree on a fixed port");
  }
  return {LaunchKind::kMultiNode, ep, {}};
}

}  // namespace

LaunchClass classify_launch(const LaunchConfig& c) {
  if (c.standalone) {
    if (c.max_nodes > 1) {
      throw CliError("--standalone runs one node; for --nnodes=" + nnodes_text(c) +
                     " use --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT (or the static flags)");
    }
    return {LaunchKind::kStandalone, {}, {}};
  }
  switch (c.rdzv_backend) {
    case agent::Backend::kEtcd:
      return classify_etcd(c);
    case agent::Backend::kC10d:
      return classify_c10d(c);
    case agent::Backend::kStatic:
      break;
  }
  return classify_static(c);
}

Endpoint parse_endpoint(const std::string& text, const std::string& flag) {
  Endpoint ep;
  std::string port_text;
  bool has_port = false;  // a port separator was seen: "host:" is a bad port, "::" a host
  if (text.starts_with("[")) {
    size_t close = text.find(']');
    if (close == std::string::npos) throw CliError(flag + "=" + text + ": missing ']'");
    ep.host = text.substr(1, close - 1);
    std::string rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') throw CliError(flag + "=" + text + ": expected [HOST]:PORT");
      port_text = rest.substr(1);
      has_port = true;
    }
  } else {
    size_t colon = text.rfind(':');
    if (colon != std::string::npos && text.find(':') == colon) {
      ep.host = text.substr(0, colon);
      port_text = text.substr(colon + 1);
      has_port = true;
    } else {
      ep.host = text;  // no port, or a bare IPv6 address
      if (colon != std::string::npos) {
        if (!is_ipv6_literal(text)) {
          throw CliError(flag + "=" + text +
                         ": not a host, an address or HOST:PORT (an IPv6 "
                         "address with a port is written [ADDR]:PORT)");
        }
        // torchrun reads "::1:0" as [::1]:0; we would read an address: say which is meant.
        auto port = parse_int(text.substr(colon + 1));
        if (is_ipv6_literal(text.substr(0, colon)) && port && *port >= 0 && *port <= 65535) {
          throw CliError(flag + "=" + text + ": write [" + text.substr(0, colon) + "]:" +
                         text.substr(colon + 1) + " for a port, or [" + text + "] for the address");
        }
      }
    }
  }
  if (!ep.host.empty() && !is_ipv6_literal(ep.host) &&
      ep.host.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") !=
          std::string::npos) {
    throw CliError(flag + "=" + text + ": '" + ep.host + "' is not a host name or address");
  }
  if (has_port) {
    auto p = parse_int(port_text);
    if (!p || *p < 0 || *p > 65535) throw CliError(flag + "=" + text + ": bad port");
    ep.port = static_cast<int>(*p);
  }
  return ep;
}

}  // namespace ddprun::launcher
