#include "launcher/launch_plan.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include "store/sys/log.hpp"
#include "agent/process/log_dir.hpp"
#include "agent/worker_env.hpp"
#include "launcher/devices.hpp"
#include "launcher/entrypoint.hpp"
#include "launcher/flags.hpp"
#include "launcher/multinode_plan.hpp"
#include "store/sys/random.hpp"

namespace ddprun::launcher {
namespace {

constexpr const char* kNotYet = "not implemented yet in this build: ";

int resolve_nproc(const LaunchConfig& c, const GetEnv& getenv) {
  const std::string& n = c.nproc_per_node;
  if (n == "cpu") return usable_cpu_count();
  if (n == "gpu") {
    int gpus = cuda_device_count(getenv);
    if (gpus == 0) throw CliError("--nproc-per-node=gpu: no CUDA GPU is visible on this machine");
    return gpus;
  }
  if (n == "auto") {
    int gpus = cuda_device_count(getenv);
    return gpus > 0 ? gpus : usable_cpu_count();
  }
  if (n == "xpu") throw CliError("--nproc-per-node=xpu: Intel XPUs are not supported by ddprun");
  return static_cast<int>(*parse_int(n));
}

agent::LocalRendezvousOptions choose_rendezvous(const LaunchConfig& c, LaunchPlan& plan) {
  agent::LocalRendezvousOptions r;
  auto loopback_store = [&](const std::string& run_id) {
    r.backend = "c10d";
    r.run_id = run_id;
    r.bind_host = "127.0.0.1";
    r.port = 0;
    r.master_addr = "localhost";
  };
  if (c.standalone) {
    for (const char* f : {"rdzv_backend", "rdzv_endpoint", "rdzv_id"}) {
      if (c.given.count(f)) plan.notices.push_back("--standalone: ignoring " + dashed(f));
    }
    loopback_store(sys::random_uuid());
    return r;
  }
  if (c.rdzv_backend == "c10d") {
    Endpoint ep = parse_endpoint(c.rdzv_endpoint, "--rdzv-endpoint");  // local (multinode_plan)
    r.backend = "c10d";
    r.run_id = c.rdzv_id;
    r.port = ep.port < 0 ? 29400 : ep.port;
    r.master_addr = ep.host.empty() ? "localhost" : ep.host;
    r.bind_host = ep.host.find(':') != std::string::npos ? "::" : "0.0.0.0";
    if (ep.host.empty() || ep.host == "localhost" || ep.host.starts_with("127.")) {
      r.bind_host = "127.0.0.1";
    }
    return r;
  }
  // static
  if (!c.rdzv_endpoint.empty()) {
    Endpoint ep = parse_endpoint(c.rdzv_endpoint, "--rdzv-endpoint");
    if (ep.port < 0)
      throw CliError("--rdzv-endpoint=" + c.rdzv_endpoint + ": the static backend needs HOST:PORT");
    r.master_addr = ep.host;
    r.port = ep.port;
  } else if (c.master_port) {
    r.master_addr = c.master_addr;
    r.port = *c.master_port;
  } else {
    // As torchrun 2.x: one node and no port chosen means a free port, not a fixed 29500
    // that another job may be using.
    loopback_store(sys::random_uuid());
    return r;
  }
  r.backend = "static";
  r.run_id = c.rdzv_id;
  // The store host of a static job is reachable from other machines, like torchrun's.
  r.bind_host = r.master_addr.find(':') != std::string::npos ? "::" : "0.0.0.0";
  return r;
}

}  // namespace

Endpoint parse_endpoint(const std::string& text, const std::string& flag) {
  Endpoint ep;
  std::string port_text;
  if (text.starts_with("[")) {
    size_t close = text.find(']');
    if (close == std::string::npos) throw CliError(flag + "=" + text + ": missing ']'");
    ep.host = text.substr(1, close - 1);
    std::string rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') throw CliError(flag + "=" + text + ": expected [HOST]:PORT");
      port_text = rest.substr(1);
    }
  } else {
    size_t colon = text.rfind(':');
    if (colon != std::string::npos && text.find(':') == colon) {
      ep.host = text.substr(0, colon);
      port_text = text.substr(colon + 1);
    } else {
      ep.host = text;  // no port, or a bare IPv6 address
    }
  }
  if (!port_text.empty() || text.ends_with(":")) {
    auto p = parse_int(port_text);
    if (!p || *p < 0 || *p > 65535) throw CliError(flag + "=" + text + ": bad port");
    ep.port = static_cast<int>(*p);
  }
  return ep;
}

LaunchPlan make_launch_plan(const LaunchConfig& c, const GetEnv& getenv,
                            std::vector<std::string> environ_strings) {
  LaunchPlan plan;
  if (!c.logs_specs.empty()) {
    throw CliError("--logs-specs loads a Python plugin into torchrun; ddprun has none");
  }
  if (!c.numa_binding.empty()) throw CliError(std::string(kNotYet) + "--numa-binding");
  plan.multi_node = multi_node_settings(c, plan.notices);
  if (!plan.multi_node) plan.rendezvous = choose_rendezvous(c, plan);

  agent::WorkerSpec& s = plan.spec;
  s.local_world_size = resolve_nproc(c, getenv);
  WorkerCommand cmd = resolve_entrypoint(c, getenv);
  s.program = cmd.program;
  s.argv0 = cmd.argv0;
  s.args = cmd.args;
  s.entrypoint_name = cmd.name;
  s.role = c.role;
  s.max_restarts = c.max_restarts;
  s.signals_to_handle = c.signals;
  s.signals_to_handle_text = c.signals_to_handle;

  int timeout = 30;
  if (c.shutdown_timeout) {
    timeout = *c.shutdown_timeout;
  } else if (auto env = getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"); env && !env->empty()) {
    auto n = parse_int(*env);
    if (!n || *n < 0)
      throw CliError("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=" + *env + ": not a number of seconds");
    timeout = static_cast<int>(*n);
  }
  s.shutdown_timeout = std::chrono::seconds(timeout);

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
  if (s.log_line_prefix_template.empty()) {
    if (auto env = getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"))
      s.log_line_prefix_template = *env;
  }
  s.duplicate_stdout_filters = c.duplicate_stdout_filters;
  s.duplicate_stderr_filters = c.duplicate_stderr_filters;
  s.virtual_local_rank = c.virtual_local_rank;
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
  s.base_env = std::move(environ_strings);
  return plan;
}

}  // namespace ddprun::launcher
