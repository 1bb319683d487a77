#include "launcher/flag_values.hpp"

#include <signal.h>

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "agent/failure.hpp"
#include "launcher/cli_parser.hpp"
#include "store/sys/signal_names.hpp"

namespace ddprun::launcher::flag_values {
namespace {

[[noreturn]] void fail(const FlagValue& v, const std::string& what) {
  throw CliError(v.source + "=" + v.value + ": " + what);
}

bool on(const FlagValue& v) {
  return v.value != "0";
}

int to_int(const FlagValue& v, long long min, long long max, const std::string& what) {
  auto n = parse_int(v.value);
  if (!n) fail(v, "not an integer");
  if (*n < min || *n > max) fail(v, what);
  return static_cast<int>(*n);
}

// Seconds, fractions allowed: 0 or more (`positive`: above 0).
Millis to_millis(const FlagValue& v, bool positive = false) {
  const std::string& s = v.value;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(d) || d < 0 || (positive && d == 0) || d > 1e9) {
    fail(v, positive ? "expected a positive number of seconds" : "expected a number of seconds");
  }
  return Millis(static_cast<long long>(std::llround(d * 1000)));
}

std::string not_empty(const FlagValue& v, const char* what = "must not be empty") {
  if (v.value.empty()) fail(v, what);
  return v.value;
}

// torchrun's comma_separated_list: ",," escapes a comma.
std::vector<std::string> comma_list(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ',' && i + 1 < text.size() && text[i + 1] == ',') {
      cur += ',';
      ++i;
    } else if (text[i] == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += text[i];
    }
  }
  out.push_back(cur);
  return out;
}

std::vector<std::string> needles(const std::string& s) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  for (auto& f : comma_list(s)) {
    if (!f.empty()) out.push_back(std::move(f));
  }
  return out;
}

agent::StdSpec std_spec(const FlagValue& v) {
  auto spec = agent::StdSpec::parse(v.value);
  if (!spec) fail(v, "expected 0, 1, 2, 3 or a per-rank map like 0:1,1:2");
  return *spec;
}

}  // namespace

void help(LaunchConfig& c, const FlagValue& v) {
  c.help = on(v);
}
void version(LaunchConfig& c, const FlagValue& v) {
  c.version = on(v);
}
void standalone(LaunchConfig& c, const FlagValue& v) {
  c.standalone = on(v);
}
void in_process_recovery(LaunchConfig& c, const FlagValue& v) {
  c.in_process_recovery = on(v);
}

void store_proxy(LaunchConfig& c, const FlagValue& v) {
  if (v.value != "auto" && v.value != "on" && v.value != "off") fail(v, "expected auto, on or off");
  c.store_proxy = v.value;
}

void virtual_local_rank(LaunchConfig& c, const FlagValue& v) {
  c.virtual_local_rank = on(v);
}
void module(LaunchConfig& c, const FlagValue& v) {
  c.module = on(v);
}
void no_python(LaunchConfig& c, const FlagValue& v) {
  c.no_python = on(v);
}
void run_path(LaunchConfig& c, const FlagValue& v) {
  c.run_path = on(v);
}
void stop_on_stdin_eof(LaunchConfig& c, const FlagValue& v) {
  c.fanout.stop_on_stdin_eof = on(v);
}

void print_completion(LaunchConfig& c, const FlagValue& v) {
  if (v.value != "bash" && v.value != "zsh" && v.value != "tcsh")
    fail(v, "expected bash, zsh or tcsh");
  c.print_completion = v.value;
}

void nnodes(LaunchConfig& c, const FlagValue& v) {
  auto parts = split(v.value, ':');
  if (parts.size() > 2) fail(v, "expected N or MIN:MAX");
  auto lo = parse_int(parts[0]);
  auto hi = parts.size() == 2 ? parse_int(parts[1]) : lo;
  if (!lo || !hi) fail(v, "expected N or MIN:MAX with integers");
  if (*lo < 1) fail(v, "the number of nodes must be at least 1");
  if (*lo > *hi) fail(v, "MIN must not exceed MAX");
  if (*hi > 1000000) fail(v, "too many nodes");
  c.min_nodes = static_cast<int>(*lo);
  c.max_nodes = static_cast<int>(*hi);
}

void nproc_per_node(LaunchConfig& c, const FlagValue& v) {
  const std::string& s = v.value;
  if (s != "cpu" && s != "gpu" && s != "auto" && s != "xpu") {
    auto n = parse_int(s);
    if (!n) fail(v, "expected a number of workers, cpu, gpu or auto");
    if (*n < 1 || *n > 65536) fail(v, "the number of workers must be between 1 and 65536");
  }
  c.nproc_per_node = s;
}

void node_rank(LaunchConfig& c, const FlagValue& v) {
  c.node_rank = to_int(v, 0, 1000000, "must be 0 or more");
}

void rdzv_backend(LaunchConfig& c, const FlagValue& v) {
  const std::string& s = v.value;
  if (s == "static") {
    c.rdzv_backend = agent::Backend::kStatic;
  } else if (s == "c10d") {
    c.rdzv_backend = agent::Backend::kC10d;
  } else if (s == "etcd" || s == "etcd-v2" || s == "etcd-v3") {
    c.rdzv_backend = agent::Backend::kEtcd;  // all three: etcd's v3 API (multinode_plan.cpp)
  } else {
    fail(v, "unknown rendezvous backend (static, c10d, etcd, etcd-v2, etcd-v3)");
  }
  c.rdzv_backend_spelled = s;
}

void rdzv_endpoint(LaunchConfig& c, const FlagValue& v) {
  c.rdzv_endpoint = v.value;
}
void rdzv_id(LaunchConfig& c, const FlagValue& v) {
  c.rdzv_id = v.value;
}

void rdzv_conf(LaunchConfig& c, const FlagValue& v) {
  c.rdzv_conf.clear();
  if (v.value.empty()) return;
  for (const auto& item : split(v.value, ',')) {
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) fail(v, "expected KEY=VALUE,KEY=VALUE");
    c.rdzv_conf[item.substr(0, eq)] = item.substr(eq + 1);
  }
}

void master_addr(LaunchConfig& c, const FlagValue& v) {
  c.master_addr = not_empty(v);
}

void master_port(LaunchConfig& c, const FlagValue& v) {
  c.master_port = to_int(v, 0, 65535, "a port is a number from 0 to 65535");
}

void local_addr(LaunchConfig& c, const FlagValue& v) {
  if (v.value.find_first_of(" \t\n") != std::string::npos) fail(v, "an address has no spaces");
  c.local_addr = v.value;
}

void max_restarts(LaunchConfig& c, const FlagValue& v) {
  c.max_restarts = to_int(v, 0, 1000000000, "must be 0 or more");
}

void monitor_interval(LaunchConfig& c, const FlagValue& v) {
  c.monitor_interval = static_cast<double>(to_millis(v).count()) / 1000;
}

void start_method(LaunchConfig& c, const FlagValue& v) {
  const std::string& s = v.value;
  if (s != "spawn" && s != "fork" && s != "forkserver")
    fail(v, "expected spawn, fork or forkserver");
  c.start_method = s;
}

void event_log_handler(LaunchConfig& c, const FlagValue& v) {
  c.event_log_handler = v.value;
}
void role(LaunchConfig& c, const FlagValue& v) {
  c.role = not_empty(v);
}

void signals_to_handle(LaunchConfig& c, const FlagValue& v) {
  c.signals.clear();
  for (const auto& item : split(v.value, ',')) {
    std::string sig = item;
    while (!sig.empty() && sig.front() == ' ') sig.erase(0, 1);
    while (!sig.empty() && sig.back() == ' ') sig.pop_back();
    auto n = sig.starts_with("SIG") ? sys::signal_number(sig) : std::nullopt;
    if (!n) fail(v, "'" + sig + "' is not a signal name like SIGTERM");
    if (*n == SIGKILL || *n == SIGSTOP) fail(v, sig + " cannot be handled");
    c.signals.push_back(*n);
  }
  c.signals_to_handle = v.value;
}

void shutdown_timeout(LaunchConfig& c, const FlagValue& v) {
  c.shutdown_timeout = std::chrono::seconds(to_int(v, 0, 1000000000, "must be 0 or more seconds"));
}

void numa_binding(LaunchConfig& c, const FlagValue& v) {
  c.numa_binding = v.value;
}

void warm_start(LaunchConfig& c, const FlagValue& v) {
  if (v.value != "auto" && v.value != "on" && v.value != "off") fail(v, "expected auto, on or off");
  c.warm_start = v.value;
}

void warm_start_modules(LaunchConfig& c, const FlagValue& v) {
  c.warm_modules.clear();
  for (auto& m : split(v.value, ',')) {
    if (m.empty()) continue;
    for (char ch : m) {
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '.') {
        fail(v, "'" + m + "' is not a module name");
      }
    }
    c.warm_modules.push_back(m);
  }
}

// SIZE: bytes with an optional K, M, G or T suffix (powers of 1024), N% of the node's memory, or
// 0 / off.
void memory_checkpoints(LaunchConfig& c, const FlagValue& v) {
  const std::string& s = v.value;
  c.memory_checkpoints = {};
  if (s == "off" || s == "0") return;
  char* end = nullptr;
  const double n = std::strtod(s.c_str(), &end);
  const std::string unit = end ? std::string(end) : "";
  if (s.empty() || !std::isfinite(n) || n < 0 || end == s.c_str()) {
    fail(v, "expected a size (e.g. 8G), a percentage of the node's memory (e.g. 25%) or off");
  }
  if (unit == "%") {
    if (n > 100) fail(v, "a percentage is at most 100");
    c.memory_checkpoints.percent = n;
    return;
  }
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"K", 1024.0},
                                                          {"M", 1024.0 * 1024},
                                                          {"G", 1024.0 * 1024 * 1024},
                                                          {"T", 1024.0 * 1024 * 1024 * 1024}};
  for (const auto& [suffix, scale] : kUnits) {
    if (unit == suffix || (*suffix && unit == std::string(suffix) + "B")) {
      c.memory_checkpoints.bytes = static_cast<uint64_t>(n * scale);
      return;
    }
  }
  fail(v, "unknown unit '" + unit + "' (K, M, G, T or %)");
}

void hang_timeout(LaunchConfig& c, const FlagValue& v) {
  c.hang_timeout = to_millis(v);
}
void hang_start_timeout(LaunchConfig& c, const FlagValue& v) {
  c.hang_start_timeout = to_millis(v);
}
void exit_timeout(LaunchConfig& c, const FlagValue& v) {
  c.exit_timeout = to_millis(v);
}

void health_port(LaunchConfig& c, const FlagValue& v) {
  c.health_port = to_int(v, 0, 65535, "a port is a number from 0 to 65535");
}

void health_host(LaunchConfig& c, const FlagValue& v) {
  c.health_host = not_empty(v);
}
void event_log(LaunchConfig& c, const FlagValue& v) {
  c.event_log = not_empty(v);
}
void log_dir(LaunchConfig& c, const FlagValue& v) {
  c.log_dir = v.value;
}
void redirects(LaunchConfig& c, const FlagValue& v) {
  c.redirects = std_spec(v);
}
void tee(LaunchConfig& c, const FlagValue& v) {
  c.tee = std_spec(v);
}

void log_line_prefix_template(LaunchConfig& c, const FlagValue& v) {
  c.log_line_prefix_template = v.value;
}

void local_ranks_filter(LaunchConfig& c, const FlagValue& v) {
  if (v.value.empty()) {
    c.local_ranks_filter.reset();
    return;
  }
  std::set<int> ranks;
  for (const auto& item : split(v.value, ',')) {
    auto n = parse_int(item);
    if (!n || *n < 0) fail(v, "expected a comma-separated list of local ranks, e.g. 0,1");
    ranks.insert(static_cast<int>(*n));
  }
  c.local_ranks_filter = std::move(ranks);
}

void duplicate_stdout_filters(LaunchConfig& c, const FlagValue& v) {
  c.duplicate_stdout_filters = needles(v.value);
}

void duplicate_stderr_filters(LaunchConfig& c, const FlagValue& v) {
  c.duplicate_stderr_filters = needles(v.value);
}

// torchrun's --logs-specs names a Python plugin; "default" is its built-in layout, which is
// the one ddprun writes.
void logs_specs(LaunchConfig&, const FlagValue& v) {
  if (v.value != "default") {
    fail(v,
         "--logs-specs loads a Python plugin into torchrun; ddprun writes torch's default "
         "layout only (--logs-specs default)");
  }
}

void hosts(LaunchConfig& c, const FlagValue& v) {
  c.fanout.hosts = not_empty(v, "expected HOST,HOST,...");
}
void hostfile(LaunchConfig& c, const FlagValue& v) {
  c.fanout.hostfile = not_empty(v, "expected a file name");
}
void include(LaunchConfig& c, const FlagValue& v) {
  c.fanout.include = v.value;
}
void exclude(LaunchConfig& c, const FlagValue& v) {
  c.fanout.exclude = v.value;
}
void ssh_command(LaunchConfig& c, const FlagValue& v) {
  c.fanout.ssh_command = not_empty(v);
}
void ssh_options(LaunchConfig& c, const FlagValue& v) {
  c.fanout.ssh_options = v.value;
}

void ssh_port(LaunchConfig& c, const FlagValue& v) {
  c.fanout.ssh_port = to_int(v, 1, 65535, "a port is a number from 1 to 65535");
}

void ssh_connect_timeout(LaunchConfig& c, const FlagValue& v) {
  Millis t = to_millis(v, true);
  if (t > std::chrono::hours(24)) fail(v, "expected a positive number of seconds");
  c.fanout.ssh_connect_timeout = t;
}

void remote_ddprun(LaunchConfig& c, const FlagValue& v) {
  if (v.value.empty() || v.value.front() != '/') fail(v, "expected an absolute path");
  c.fanout.remote_ddprun = v.value;
}

void exports(LaunchConfig& c, const FlagValue& v) {
  c.fanout.exports.clear();
  for (auto& item : split(v.value, ',')) {
    if (!item.empty()) c.fanout.exports.push_back(item);
  }
}

}  // namespace ddprun::launcher::flag_values
