#include "launcher/fanout/fanout_plan.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdlib>

#include "launcher/fanout/host_list.hpp"
#include "launcher/fanout/shell_words.hpp"
#include "launcher/flags.hpp"
#include "launcher/multinode_plan.hpp"

namespace ddprun::launcher {
namespace {

std::vector<NodeSlots> select_nodes(const LaunchConfig& c, const FanoutInputs& in) {
  const FanoutConfig& f = c.fanout;
  if (!f.hosts.empty() && !f.hostfile.empty()) {
    throw CliError("--hosts and --hostfile cannot be used together");
  }
  std::vector<HostEntry> hosts;
  if (!f.hosts.empty()) {
    hosts = parse_host_list(f.hosts);
  } else {
    auto text = in.read_file(f.hostfile);
    if (!text) throw CliError("--hostfile=" + f.hostfile + ": no such file");
    hosts = parse_hostfile(*text, f.hostfile);
  }
  const bool filtered = !f.include.empty() || !f.exclude.empty();
  std::vector<NodeSlots> nodes = apply_filters(hosts, f.include, f.exclude);
  if (c.given.count("nnodes")) {
    if (filtered) throw CliError("--nnodes cannot be combined with --include/--exclude");
    if (c.min_nodes != c.max_nodes) {
      if (c.rdzv_backend == agent::Backend::kStatic) {
        throw CliError("with --hosts/--hostfile, --nnodes is how many of the hosts to use (N)");
      }
    } else if (static_cast<size_t>(c.min_nodes) > nodes.size()) {
      throw CliError("--nnodes=" + std::to_string(c.min_nodes) + " but only " +
                     std::to_string(nodes.size()) + " host(s) are listed");
    } else {
      nodes.resize(static_cast<size_t>(c.min_nodes));  // the first N, as DeepSpeed
    }
  }
  if (c.given.count("nproc_per_node")) {
    for (const auto& n : nodes) {
      if (n.devices) {
        throw CliError(
            "--nproc-per-node cannot be combined with an --include/--exclude that "
            "names slots (host " +
            n.host + ")");
      }
    }
  }
  return nodes;
}

void check_flags(const LaunchConfig& c) {
  for (const std::string& name : c.given) {
    if (flag_named(name).fanout == Fanout::kPerNode) {
      throw CliError(dashed(name) +
                     " cannot be used with --hosts/--hostfile: the fan-out sets it "
                     "for each host");
    }
  }
}

// The user's flags as the remote parser will read them (PET_* values and torchrun's variables
// made explicit: the remote ddprun gets sshd's environment, not ours).
std::vector<std::string> forwarded_flags(const LaunchConfig& c) {
  std::vector<std::string> out;
  for (const Flag& f : flag_table()) {
    const std::string name(f.name);
    if (!c.given.count(name) || f.fanout != Fanout::kForward) continue;
    if (!f.takes_value) {
      out.push_back(dashed(name));
    } else if (auto it = c.given_values.find(name); it != c.given_values.end()) {
      out.push_back(dashed(name) + "=" + it->second);
    }
  }
  return out;
}

std::vector<std::string> ssh_prefix(const FanoutConfig& f, std::chrono::milliseconds timeout) {
  std::vector<std::string> argv = split_shell_words(f.ssh_command, "--ssh-command");
  if (argv.empty()) throw CliError("--ssh-command: no program named");
  for (auto& w : split_shell_words(f.ssh_options, "--ssh-options")) argv.push_back(std::move(w));
  // ssh keeps the first value of an option: the user's options above win over these.
  const long secs = std::lround(std::ceil(static_cast<double>(timeout.count()) / 1000.0));
  const std::vector<std::string> ours = {"BatchMode=yes", "ConnectTimeout=" + std::to_string(secs),
                                         "ServerAliveInterval=5", "ServerAliveCountMax=6"};
  for (const auto& o : ours) {
    argv.push_back("-o");
    argv.push_back(o);
  }
  if (f.ssh_port) {
    argv.push_back("-p");
    argv.push_back(std::to_string(*f.ssh_port));
  }
  return argv;
}

std::vector<std::string> node_flags(const LaunchConfig& c, const std::vector<NodeSlots>& nodes,
                                    size_t i) {
  std::vector<std::string> out;
  const std::string& first = nodes.front().host;
  if (!c.given.count("nnodes")) {
    out.push_back("--nnodes=" + std::to_string(nodes.size()));
  } else {
    out.push_back("--nnodes=" + std::to_string(c.min_nodes) +
                  (c.min_nodes == c.max_nodes ? "" : ":" + std::to_string(c.max_nodes)));
  }
  out.push_back("--node-rank=" + std::to_string(i));
  out.push_back("--local-addr=" + nodes[i].host);
  if (c.rdzv_backend == agent::Backend::kStatic) {
    out.push_back("--master-addr=" + (c.given.count("master_addr") ? c.master_addr : first));
    out.push_back("--master-port=" + std::to_string(c.master_port.value_or(agent::kStaticPort)));
  } else if (c.rdzv_backend == agent::Backend::kC10d && c.rdzv_endpoint.empty()) {
    out.push_back("--rdzv-endpoint=" + first + ":" +
                  std::to_string(c.master_port.value_or(agent::kC10dPort)));
  }
  if (nodes[i].devices) {
    out.push_back("--nproc-per-node=" + std::to_string(nodes[i].devices->size()));
  } else if (c.given.count("nproc_per_node")) {
    out.push_back("--nproc-per-node=" + c.nproc_per_node);
  } else if (nodes[i].slots) {
    out.push_back("--nproc-per-node=" + std::to_string(*nodes[i].slots));
  }
  return out;
}

std::string devices_text(const std::vector<int>& devices) {
  std::string s;
  for (int d : devices) s += (s.empty() ? "" : ",") + std::to_string(d);
  return s;
}

}  // namespace

FanoutPlan make_fanout_plan(const LaunchConfig& c, const FanoutInputs& in) {
  check_flags(c);
  FanoutPlan plan;
  std::vector<NodeSlots> nodes = select_nodes(c, in);
  plan.cwd = in.cwd;
  plan.remote_ddprun = c.fanout.remote_ddprun.empty() ? in.self_exe : c.fanout.remote_ddprun;
  plan.connect_timeout = c.fanout.ssh_connect_timeout;
  plan.shutdown_timeout = c.shutdown_timeout;
  // The node hosting the rendezvous store waits up to close_timeout for the others' goodbyes:
  // the value the nodes will read, validated as they will.
  agent::RendezvousSettings rdzv;
  rdzv.backend = c.rdzv_backend;
  std::vector<std::string> unused;
  apply_rdzv_conf(c, rdzv, unused);
  plan.close_timeout = rdzv.close_timeout;
  const EnvList env =
      collect_exports(c.fanout.exports, in.getenv, in.read_file, in.cwd, plan.notices);
  const std::vector<std::string> ssh = ssh_prefix(c.fanout, plan.connect_timeout);
  const std::vector<std::string> user_flags = forwarded_flags(c);

  for (size_t i = 0; i < nodes.size(); ++i) {
    RemoteNode node;
    node.host = nodes[i].host;
    node.node_rank = static_cast<int>(i);
    std::vector<std::string> words = {"env"};
    for (const auto& [name, value] : env) words.push_back(name + "=" + value);
    if (nodes[i].devices) {
      words.push_back("CUDA_VISIBLE_DEVICES=" + devices_text(*nodes[i].devices));
    }
    words.push_back(plan.remote_ddprun);
    words.push_back("--stop-on-stdin-eof");
    for (const auto& f : user_flags) words.push_back(f);
    for (auto& f : node_flags(c, nodes, i)) words.push_back(std::move(f));
    words.push_back("--");
    words.push_back(c.entrypoint);
    for (const auto& a : c.entrypoint_args) words.push_back(a);
    node.remote_command = "cd " + shell_quote(plan.cwd) + " && exec " + shell_join(words);

    node.ssh_argv = ssh;
    node.ssh_argv.insert(node.ssh_argv.end(), {"--", node.host, node.remote_command});
    node.probe_argv = ssh;
    node.probe_argv.insert(
        node.probe_argv.end(),
        {"-n", "--", node.host,
         "cd " + shell_quote(plan.cwd) + " || exit " + std::to_string(kProbeNoDirectory) +
             "; test -x " + shell_quote(plan.remote_ddprun) + " || exit " +
             std::to_string(kProbeNoDdprun)});
    plan.nodes.push_back(std::move(node));
  }
  return plan;
}

FanoutInputs this_process_inputs(GetEnv getenv) {
  FanoutInputs in;
  in.getenv = std::move(getenv);
  in.read_file = &read_text_file;
  char buf[4096];
  if (::getcwd(buf, sizeof buf)) in.cwd = buf;
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) in.self_exe.assign(buf, static_cast<size_t>(n));
  if (in.cwd.empty() || in.self_exe.empty()) {
    throw CliError("cannot tell the current directory or ddprun's own path");
  }
  return in;
}

}  // namespace ddprun::launcher
