#include "launcher/launch_plan.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>

#include "agent/worker_env.hpp"
#include "launcher/bind_hosts.hpp"
#include "launcher/devices.hpp"
#include "launcher/entrypoint.hpp"
#include "launcher/flags.hpp"
#include "launcher/multinode_plan.hpp"
#include "launcher/scheduler_env.hpp"
#include "store/sys/net.hpp"
#include "store/sys/random.hpp"

namespace ddprun::launcher {
namespace {

constexpr const char* kNotYet = "not implemented yet in this build: ";

// CUDA devices this node may use: inside a Slurm step, no more than the step was given.
int usable_gpu_count(const GetEnv& getenv) {
  int gpus = cuda_device_count(getenv);
  if (auto slurm = slurm_gpus_on_node(getenv)) gpus = std::min(gpus, *slurm);
  return gpus;
}

int resolve_nproc(const LaunchConfig& c, const GetEnv& getenv) {
  const std::string& n = c.nproc_per_node;
  if (n == "cpu") return usable_cpu_count();
  if (n == "gpu") {
    int gpus = usable_gpu_count(getenv);
    if (gpus == 0) {
      throw CliError(slurm_gpus_on_node(getenv) == 0
                         ? "--nproc-per-node=gpu: SLURM_GPUS_ON_NODE=0, the step has no GPU "
                           "(ask for some: srun --gpus-per-node=N)"
                         : "--nproc-per-node=gpu: no CUDA GPU is visible on this machine");
    }
    return gpus;
  }
  if (n == "auto") {
    int gpus = usable_gpu_count(getenv);
    return gpus > 0 ? gpus : usable_cpu_count();
  }
  if (n == "xpu") throw CliError("--nproc-per-node=xpu: Intel XPUs are not supported by ddprun");
  return static_cast<int>(*parse_int(n));
}

// kStandalone, and one node with no port chosen: as torchrun 2.x, a free port each attempt
// (not a fixed 29500 that another job may be using), loopback only.
void use_loopback_store(agent::LocalRendezvousOptions& r) {
  r.run_id = sys::random_uuid();
  r.bind_host = "127.0.0.1";
  r.port = 0;
  r.master_addr = "localhost";
}

// The single-node rendezvous of a command line that classify_launch did not call multi-node.
agent::LocalRendezvousOptions local_rendezvous(const LaunchConfig& c, const LaunchClass& lc,
                                               std::vector<std::string>& notices) {
  const Endpoint& ep = lc.endpoint;
  agent::LocalRendezvousOptions r;
  r.run_id = c.rdzv_id;
  r.max_restarts = c.max_restarts;
  {
    // One node needs none of the round's timeouts, but a value the multi-node job would
    // refuse is refused here too.
    agent::RendezvousSettings unused;
    std::vector<std::string> ignored;
    apply_rdzv_conf(c, unused, ignored);
  }
  switch (lc.kind) {
    case LaunchKind::kStandalone:
      for (const char* f : {"rdzv_backend", "rdzv_endpoint", "rdzv_id"}) {
        if (c.given.count(f)) notices.push_back("--standalone: ignoring " + dashed(f));
      }
      use_loopback_store(r);
      return r;
    case LaunchKind::kSingleNodeC10d: {
      // The endpoint is empty or loopback: a literal is bound as named (127.0.0.5, ::1),
      // "localhost" and no host at all on 127.0.0.1.
      r.port = ep.port.value_or(agent::kC10dPort);
      r.master_addr = ep.host.empty() ? "localhost" : ep.host;
      r.bind_host = sys::is_address_literal(ep.host) ? ep.host : "127.0.0.1";
      return r;
    }
    case LaunchKind::kSingleNodeStatic:
      if (!ep.port) {
        use_loopback_store(r);
        return r;
      }
      r.port = *ep.port;
      r.master_addr = ep.host;
      r.bind_host = bind_address(ep.host, is_ipv6_literal(ep.host));
      return r;
    case LaunchKind::kMultiNode:
      break;
  }
  throw std::logic_error("local_rendezvous: a multi-node command line");
}

// Hangs, health and events: the flags (with torchrun's variables for them, flags.cpp) and
// torchrun's FileTimer variables.
void plan_watching(const LaunchConfig& c, const GetEnv& getenv, agent::WorkerSpec& s) {
  s.hang_timeout = c.hang_timeout;
  s.hang_start_timeout = c.hang_start_timeout;
  s.exit_timeout = c.exit_timeout;
  if (auto on = getenv("TORCHELASTIC_ENABLE_FILE_TIMER"); on && *on == "1") {
    s.file_timer = true;
    if (auto path = getenv("TORCHELASTIC_TIMER_FILE"); path && !path->empty()) s.timer_file = *path;
  }
  s.health_host = c.health_host;
  s.health_port = c.health_port;
  if (!sys::is_address_literal(s.health_host)) {
    throw CliError("--health-host=" + s.health_host +
                   ": expected an address such as 127.0.0.1, 0.0.0.0 or ::1");
  }
  s.event_log = c.event_log;
}

// --warm-start: "auto" is on when a Python entrypoint's workers may start more than once: the
// job may restart, or the nodes re-form (an elastic backend).
bool warm_start_wanted(const LaunchConfig& c, const LaunchPlan& plan, const WorkerCommand& cmd) {
  if (!cmd.python || c.warm_start == "off") return false;
  if (c.warm_start == "on") return true;
  return c.max_restarts > 0 ||
         (plan.multi_node && plan.multi_node->backend != agent::Backend::kStatic);
}

}  // namespace

LaunchPlan make_launch_plan(const LaunchConfig& c, const GetEnv& getenv,
                            std::vector<std::string> environ_strings) {
  LaunchPlan plan;
  plan.notices = c.notices;
  if (!c.numa_binding.empty()) throw CliError(std::string(kNotYet) + "--numa-binding");
  LaunchClass lc = classify_launch(c);
  plan.kind = lc.kind;
  if (lc.kind == LaunchKind::kMultiNode) {
    plan.multi_node = multi_node_settings(c, lc, plan.notices);
  } else {
    plan.rendezvous = local_rendezvous(c, lc, plan.notices);
  }

  agent::WorkerSpec& s = plan.spec;
  s.local_world_size = resolve_nproc(c, getenv);
  WorkerCommand cmd = resolve_entrypoint(c, getenv);
  s.program = cmd.program;
  s.argv0 = cmd.argv0;
  s.args = cmd.args;
  s.entrypoint_name = cmd.name;
  s.python = cmd.python;
  s.warm_modules = c.warm_modules;
  s.warm_start = warm_start_wanted(c, plan, cmd);
  s.memory_checkpoint_bytes = c.memory_checkpoints.bytes;
  s.memory_checkpoint_percent = c.memory_checkpoints.percent;
  if (c.warm_start == "on" && !cmd.python) {
    plan.notices.push_back(
        "--warm-start=on: the entrypoint is not a Python script or module, so "
        "its workers start cold");
  }
  s.role = c.role;
  s.signals_to_handle = c.signals;
  s.signals_to_handle_text = c.signals_to_handle;

  s.shutdown_timeout = c.shutdown_timeout;
  plan_watching(c, getenv, s);

  if (!c.log_dir.empty()) {
    struct stat st {};
    if (::stat(c.log_dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      throw CliError("--log-dir=" + c.log_dir + ": is a file, not a directory");
    }
  }
  s.log_dir = c.log_dir;
  s.redirects = c.redirects;
  s.tee = c.tee;
  s.local_ranks_filter = c.local_ranks_filter;
  s.log_line_prefix_template = c.log_line_prefix_template;
  s.duplicate_stdout_filters = c.duplicate_stdout_filters;
  s.duplicate_stderr_filters = c.duplicate_stderr_filters;
  s.virtual_local_rank = c.virtual_local_rank;
  s.in_process_recovery = c.in_process_recovery;
  if (c.store_proxy == "on" && plan.kind != LaunchKind::kMultiNode) {
    plan.notices.push_back(
        "--store-proxy: one node's workers use the agent's store directly (the proxy is for "
        "jobs of several nodes)");
  }
  if (s.virtual_local_rank) {
    for (int r = 0; r < s.local_world_size; ++r) {
      if (!agent::virtual_device(environ_strings, r)) {
        throw CliError("--virtual-local-rank: CUDA_VISIBLE_DEVICES lists fewer devices than the " +
                       std::to_string(s.local_world_size) + " workers");
      }
    }
  }

  if (!c.local_addr.empty() && !plan.multi_node) {
    plan.notices.push_back("--local-addr=" + c.local_addr + " has no effect on a single node");
  }
  if (c.event_log_handler != "null") {
    plan.notices.push_back("--event-log-handler=" + c.event_log_handler +
                           " is ignored (ddprun logs events as lines on stderr)");
  }
  if (!agent::find_env(environ_strings, "OMP_NUM_THREADS") && s.local_world_size > 1) {
    environ_strings.push_back("OMP_NUM_THREADS=1");
    plan.notices.push_back("OMP_NUM_THREADS is not set: using 1 for each of the " +
                           std::to_string(s.local_world_size) +
                           " workers so they do not oversubscribe the cores; set it to tune");
  }
  // A Python worker that dies of SIGSEGV, SIGBUS, SIGABRT, SIGFPE or SIGILL prints its Python
  // stacks on its stderr (the standard library's faulthandler), which the failure summary
  // shows; PYTHONFAULTHANDLER set to anything, empty included, is left as it is.
  if (s.python && !agent::find_env(environ_strings, "PYTHONFAULTHANDLER")) {
    environ_strings.push_back("PYTHONFAULTHANDLER=1");
  }
  s.base_env = std::move(environ_strings);
  return plan;
}

}  // namespace ddprun::launcher
