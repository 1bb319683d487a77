#include "launcher/cli_parser.hpp"

#include <signal.h>

#include <charconv>
#include <cstdlib>
#include <map>

#include "agent/failure.hpp"
#include "launcher/flags.hpp"
#include "launcher/scheduler_env.hpp"

namespace ddprun::launcher {
namespace {

// Where a flag's value came from, for error messages.
struct RawValue {
  std::string value;
  std::string source;  // "--nnodes" or "PET_NNODES"
};

[[noreturn]] void fail(const RawValue& v, const std::string& what) {
  throw CliError(v.source + "=" + v.value + ": " + what);
}

int to_int(const RawValue& v, long long min, long long max, const std::string& what) {
  auto n = parse_int(v.value);
  if (!n) fail(v, "not an integer");
  if (*n < min || *n > max) fail(v, what);
  return static_cast<int>(*n);
}

bool pet_bool(const std::string& name, const std::string& value) {
  auto n = parse_int(value);
  if (!n) throw CliError(name + "=" + value + ": must be an integer (0 or 1)");
  return *n != 0;
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

// apply_value()'s checks, one helper per --help section (the entrypoint section has only
// switches). Each returns false for a name it does not own, so apply_value() tries them in turn.

void apply_nnodes(LaunchConfig& c, const RawValue& v) {
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

bool apply_node_value(LaunchConfig& c, const std::string& name, const RawValue& v) {
  const std::string& s = v.value;
  if (name == "nnodes") {
    apply_nnodes(c, v);
  } else if (name == "nproc_per_node") {
    if (s != "cpu" && s != "gpu" && s != "auto" && s != "xpu") {
      auto n = parse_int(s);
      if (!n) fail(v, "expected a number of workers, cpu, gpu or auto");
      if (*n < 1 || *n > 65536) fail(v, "the number of workers must be between 1 and 65536");
    }
    c.nproc_per_node = s;
  } else if (name == "node_rank") {
    c.node_rank = to_int(v, 0, 1000000, "must be 0 or more");
  } else {
    return false;
  }
  return true;
}

void apply_rdzv_conf(LaunchConfig& c, const RawValue& v) {
  c.rdzv_conf.clear();
  if (v.value.empty()) return;
  for (const auto& item : split(v.value, ',')) {
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) fail(v, "expected KEY=VALUE,KEY=VALUE");
    c.rdzv_conf[item.substr(0, eq)] = item.substr(eq + 1);
  }
}

bool apply_rendezvous_value(LaunchConfig& c, const std::string& name, const RawValue& v) {
  const std::string& s = v.value;
  if (name == "rdzv_backend") {
    if (s != "static" && s != "c10d" && s != "etcd" && s != "etcd-v2" && s != "etcd-v3") {
      fail(v, "unknown rendezvous backend (static, c10d, etcd, etcd-v2, etcd-v3)");
    }
    c.rdzv_backend = s;
  } else if (name == "rdzv_endpoint") {
    c.rdzv_endpoint = s;
  } else if (name == "rdzv_id") {
    c.rdzv_id = s;
  } else if (name == "rdzv_conf") {
    apply_rdzv_conf(c, v);
  } else if (name == "master_addr") {
    if (s.empty()) fail(v, "must not be empty");
    c.master_addr = s;
  } else if (name == "master_port") {
    c.master_port = to_int(v, 0, 65535, "a port is a number from 0 to 65535");
  } else if (name == "local_addr") {
    c.local_addr = s;
  } else {
    return false;
  }
  return true;
}

void apply_signals(LaunchConfig& c, const RawValue& v) {
  c.signals.clear();
  for (const auto& item : split(v.value, ',')) {
    std::string sig = item;
    while (!sig.empty() && sig.front() == ' ') sig.erase(0, 1);
    while (!sig.empty() && sig.back() == ' ') sig.pop_back();
    auto n = sig.starts_with("SIG") ? agent::signal_number(sig) : std::nullopt;
    if (!n) fail(v, "'" + sig + "' is not a signal name like SIGTERM");
    if (*n == SIGKILL || *n == SIGSTOP) fail(v, sig + " cannot be handled");
    c.signals.push_back(*n);
  }
  c.signals_to_handle = v.value;
}

double to_seconds(const RawValue& v) {
  const std::string& s = v.value;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(d >= 0) || d > 1e9) fail(v, "expected a number of seconds");
  return d;
}

bool apply_worker_value(LaunchConfig& c, const std::string& name, const RawValue& v) {
  const std::string& s = v.value;
  if (name == "max_restarts") {
    c.max_restarts = to_int(v, 0, 1000000000, "must be 0 or more");
  } else if (name == "monitor_interval") {
    c.monitor_interval = to_seconds(v);
  } else if (name == "start_method") {
    if (s != "spawn" && s != "fork" && s != "forkserver") {
      fail(v, "expected spawn, fork or forkserver");
    }
    c.start_method = s;
  } else if (name == "event_log_handler") {
    c.event_log_handler = s;
  } else if (name == "role") {
    if (s.empty()) fail(v, "must not be empty");
    c.role = s;
  } else if (name == "signals_to_handle") {
    apply_signals(c, v);
  } else if (name == "shutdown_timeout") {
    c.shutdown_timeout = to_int(v, 0, 1000000000, "must be 0 or more seconds");
  } else if (name == "numa_binding") {
    c.numa_binding = s;
  } else {
    return false;
  }
  return true;
}

void apply_local_ranks_filter(LaunchConfig& c, const RawValue& v) {
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

std::vector<std::string> duplicate_filters(const std::string& s) {
  std::vector<std::string> filters;
  if (s.empty()) return filters;
  for (auto& f : comma_list(s)) {
    if (!f.empty()) filters.push_back(std::move(f));
  }
  return filters;
}

bool apply_log_value(LaunchConfig& c, const std::string& name, const RawValue& v) {
  const std::string& s = v.value;
  if (name == "log_dir") {
    c.log_dir = s;
  } else if (name == "redirects" || name == "tee") {
    auto spec = agent::StdSpec::parse(s);
    if (!spec) fail(v, "expected 0, 1, 2, 3 or a per-rank map like 0:1,1:2");
    (name == "tee" ? c.tee : c.redirects) = *spec;
  } else if (name == "log_line_prefix_template") {
    c.log_line_prefix_template = s;
  } else if (name == "local_ranks_filter") {
    apply_local_ranks_filter(c, v);
  } else if (name == "duplicate_stdout_filters") {
    c.duplicate_stdout_filters = duplicate_filters(s);
  } else if (name == "duplicate_stderr_filters") {
    c.duplicate_stderr_filters = duplicate_filters(s);
  } else if (name == "logs_specs") {
    c.logs_specs = s;
  } else {
    return false;
  }
  return true;
}

bool apply_health_value(LaunchConfig& c, const std::string& name, const RawValue& v) {
  const std::string& s = v.value;
  if (name == "hang_timeout") {
    c.hang_timeout = to_seconds(v);
  } else if (name == "hang_start_timeout") {
    c.hang_start_timeout = to_seconds(v);
  } else if (name == "exit_timeout") {
    c.exit_timeout = to_seconds(v);
  } else if (name == "health_port") {
    c.health_port = to_int(v, 0, 65535, "a port is a number from 0 to 65535");
  } else if (name == "health_host") {
    if (s.empty()) fail(v, "must not be empty");
    c.health_host = s;
  } else if (name == "event_log") {
    if (s.empty()) fail(v, "must not be empty");
    c.event_log = s;
  } else {
    return false;
  }
  return true;
}

// Every value flag in flag_table() has an owner above; a name none owns is left alone.
void apply_value(LaunchConfig& c, const std::string& name, const RawValue& v) {
  if (apply_node_value(c, name, v)) return;
  if (apply_rendezvous_value(c, name, v)) return;
  if (apply_worker_value(c, name, v)) return;
  if (apply_health_value(c, name, v)) return;
  if (apply_fanout_value(c.fanout, name, v.value, v.source)) return;
  apply_log_value(c, name, v);
}

void apply_switch(LaunchConfig& c, const std::string& name, bool on) {
  if (name == "help")
    c.help = on;
  else if (name == "version")
    c.version = on;
  else if (name == "standalone")
    c.standalone = on;
  else if (name == "virtual_local_rank")
    c.virtual_local_rank = on;
  else if (name == "module")
    c.module = on;
  else if (name == "no_python")
    c.no_python = on;
  else if (name == "run_path")
    c.run_path = on;
  else if (name == "stop_on_stdin_eof")
    c.fanout.stop_on_stdin_eof = on;
}

// What the command line and PET_* said, by canonical flag name: the command line's last value
// wins, and PET_* only fills in what the command line left out.
struct RawFlags {
  std::map<std::string, RawValue> values;
  std::map<std::string, bool> switches;
};

// Finds the flag one option token names. `spelled` is the option as the user wrote it (for
// messages); `inline_value` is what followed "=" or a short option's letter.
const Flag& identify_flag(const std::string& a, std::string& spelled,
                          std::optional<std::string>& inline_value) {
  if (a[1] == '-') {
    size_t eq = a.find('=');
    spelled = a.substr(0, eq);
    if (eq != std::string::npos) inline_value = a.substr(eq + 1);
    bool ambiguous = false;
    const Flag* flag = find_long_flag(std::string_view(spelled).substr(2), ambiguous);
    if (!flag) {
      throw CliError(ambiguous ? "ambiguous option " + spelled + " (say which one)"
                               : "unrecognized option " + spelled);
    }
    return *flag;
  }
  const Flag* flag = find_short_flag(a[1]);
  spelled = a.substr(0, 2);
  if (!flag) throw CliError("unrecognized option " + a);
  if (a.size() > 2) {
    if (!flag->takes_value) throw CliError("unrecognized option " + a);
    inline_value = a.substr(a[2] == '=' ? 3 : 2);
  }
  return *flag;
}

// Reads the options into `raw` up to the entrypoint: the first non-option, or whatever follows
// "--". The entrypoint and everything after it go into `c` verbatim.
void read_options(const std::vector<std::string>& args, RawFlags& raw, LaunchConfig& c) {
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.size() < 2 || a[0] != '-') break;  // the entrypoint
    std::string spelled;
    std::optional<std::string> inline_value;
    const Flag& flag = identify_flag(a, spelled, inline_value);
    const std::string name(flag.name);
    if (!flag.takes_value) {
      if (inline_value) throw CliError(spelled + " takes no value");
      raw.switches[name] = true;
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) throw CliError(spelled + " needs a value");
      inline_value = args[++i];
    }
    raw.values[name] = RawValue{*inline_value, spelled};
  }
  if (i < args.size()) {
    c.entrypoint = args[i];
    c.entrypoint_args.assign(args.begin() + static_cast<long>(i) + 1, args.end());
  }
}

// PET_<FLAG> for everything not given on the command line.
void read_pet_defaults(const GetEnv& getenv, RawFlags& raw) {
  for (const Flag& f : flag_table()) {
    const std::string name(f.name);
    if (name == "help" || name == "version") continue;
    if (raw.values.count(name) || raw.switches.count(name)) continue;
    const std::string var = pet_variable(name);
    auto env = getenv(var);
    if (!env || (env->empty() && f.takes_value)) continue;
    if (f.takes_value) {
      raw.values[name] = RawValue{*env, var};
    } else {
      // Set but empty switches it on: Kubeflow's PyTorchJob says standalone: true with
      // PET_STANDALONE="" (torchrun itself fails on int("")).
      raw.switches[name] = env->empty() || pet_bool(var, *env);
    }
  }
}

// What a batch scheduler implies (scheduler_env.hpp), for the flags neither the command line
// nor PET_* set; its one-line summary becomes a notice.
void read_scheduler_defaults(const GetEnv& getenv, RawFlags& raw, LaunchConfig& c) {
  std::set<std::string> given;
  for (const auto& [name, v] : raw.values) given.insert(name);
  auto backend = raw.values.find("rdzv_backend");
  auto standalone = raw.switches.find("standalone");
  SchedulerFlags d = derive_scheduler_flags(
      getenv, given, backend == raw.values.end() ? "static" : backend->second.value,
      standalone != raw.switches.end() && standalone->second);
  if (!d.error.empty()) throw CliError(d.error);
  for (auto& f : d.flags) raw.values[f.name] = RawValue{f.value, f.source};
  if (!d.notice.empty()) c.notices.push_back(d.notice);
}

// Checks that involve more than one flag, made once every flag has been applied.
void check_combination(const LaunchConfig& c) {
  if (c.module && c.no_python) {
    throw CliError("-m/--module and --no-python cannot be used together");
  }
  if (c.entrypoint.empty()) {
    throw CliError("missing the entrypoint: a script.py, a -m module or a program to run");
  }
  if (!c.fanout.active()) {
    for (const auto& name : c.given) {
      if (is_fanout_flag(name)) throw CliError(dashed(name) + " needs --hosts or --hostfile");
    }
  }
}

}  // namespace

std::optional<long long> parse_int(std::string_view text) {
  long long v = 0;
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  while (true) {
    size_t pos = text.find(sep);
    out.emplace_back(text.substr(0, pos));
    if (pos == std::string_view::npos) break;
    text.remove_prefix(pos + 1);
  }
  return out;
}

LaunchConfig parse_command_line(const std::vector<std::string>& args, const GetEnv& getenv) {
  LaunchConfig c;
  RawFlags raw;
  read_options(args, raw, c);
  read_pet_defaults(getenv, raw);
  if (!raw.switches.count("help") && !raw.switches.count("version")) {
    read_scheduler_defaults(getenv, raw, c);
  }

  for (const auto& [name, on] : raw.switches) {
    apply_switch(c, name, on);
    if (on) c.given.insert(name);
  }
  if (c.help || c.version) return c;
  for (const auto& [name, v] : raw.values) {
    apply_value(c, name, v);
    c.given.insert(name);
    c.given_values[name] = v.value;
  }
  if (c.signals.empty()) apply_value(c, "signals_to_handle", RawValue{c.signals_to_handle, ""});
  check_combination(c);
  return c;
}

}  // namespace ddprun::launcher
