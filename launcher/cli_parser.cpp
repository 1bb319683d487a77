#include "launcher/cli_parser.hpp"

#include <charconv>
#include <cstdlib>
#include <map>

#include "launcher/flags.hpp"
#include "launcher/scheduler_env.hpp"

namespace ddprun::launcher {
namespace {

bool pet_bool(const std::string& name, const std::string& value) {
  auto n = parse_int(value);
  if (!n) throw CliError(name + "=" + value + ": must be an integer (0 or 1)");
  return *n != 0;
}

// What the sources said, by canonical flag name: the command line's last value wins, then
// PET_<FLAG>, then torchrun's own variable for the flag, then a batch scheduler. A switch's
// value is "1" or "0".
using Given = std::map<std::string, FlagValue>;

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
void read_options(const std::vector<std::string>& args, Given& given, LaunchConfig& c) {
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
      given[name] = FlagValue{"1", spelled};
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) throw CliError(spelled + " needs a value");
      inline_value = args[++i];
    }
    given[name] = FlagValue{*inline_value, spelled};
  }
  if (i < args.size()) {
    c.entrypoint = args[i];
    c.entrypoint_args.assign(args.begin() + static_cast<long>(i) + 1, args.end());
  }
}

// PET_<FLAG>, then torchrun's own variable for the flag (the row's `env`), for everything not
// given on the command line.
void read_environment(const GetEnv& getenv, Given& given) {
  for (const Flag& f : flag_table()) {
    const std::string name(f.name);
    if (f.fanout == Fanout::kLauncher && f.group == "general") continue;  // --help, ...
    if (given.count(name)) continue;
    const std::string pet = pet_variable(name);
    auto env = getenv(pet);
    std::string var = pet;
    if ((!env || env->empty()) && !f.env.empty()) {
      var = std::string(f.env);
      env = getenv(var);
    }
    if (!env || (env->empty() && f.takes_value)) continue;
    if (f.takes_value) {
      given[name] = FlagValue{*env, var};
    } else {
      // Set but empty switches it on: Kubeflow's PyTorchJob says standalone: true with
      // PET_STANDALONE="" (torchrun itself fails on int("")).
      given[name] = FlagValue{env->empty() || pet_bool(var, *env) ? "1" : "0", var};
    }
  }
}

// What a batch scheduler implies (scheduler_env.hpp), for the flags no other source set; its
// one-line summary becomes a notice. Which flags it implies depends on the backend chosen.
void read_scheduler(const GetEnv& getenv, Given& given, LaunchConfig& c) {
  std::set<std::string> names;
  for (const auto& [name, v] : given) names.insert(name);
  LaunchConfig probe;
  const Flag& backend_row = flag_named("rdzv_backend");
  auto backend = given.find("rdzv_backend");
  backend_row.apply(probe, backend != given.end()
                               ? backend->second
                               : FlagValue{std::string(backend_row.default_value), "the default"});
  auto standalone = given.find("standalone");
  SchedulerFlags d =
      derive_scheduler_flags(getenv, names, probe.rdzv_backend,
                             standalone != given.end() && standalone->second.value == "1");
  if (!d.error.empty()) throw CliError(d.error);
  for (auto& f : d.flags) given[f.name] = FlagValue{f.value, f.source};
  if (!d.notice.empty()) c.notices.push_back(d.notice);
}

// Every row of the table, in order: its value from a source, else its default.
void apply_all(const Given& given, LaunchConfig& c) {
  for (const Flag& f : flag_table()) {
    const std::string name(f.name);
    auto it = given.find(name);
    if (it != given.end()) {
      f.apply(c, it->second);
      c.given.insert(name);
      if (f.takes_value) c.given_values[name] = it->second.value;
    } else if (!f.default_value.empty()) {
      f.apply(c, FlagValue{std::string(f.default_value), "the default " + dashed(name)});
    }
  }
}

// Checks that involve more than one flag, made once every flag has been applied.
void check_combination(const LaunchConfig& c) {
  if (c.module && c.no_python) {
    throw CliError("-m/--module and --no-python cannot be used together");
  }
  if (c.run_path && (c.module || c.no_python)) {
    throw CliError(
        "--run-path runs a Python script: it cannot be used with -m/--module or "
        "--no-python");
  }
  if (c.entrypoint.empty()) {
    throw CliError("missing the entrypoint: a script.py, a -m module or a program to run");
  }
  if (!c.fanout.active()) {
    for (const auto& name : c.given) {
      const Flag& f = flag_named(name);
      if (f.group == "ssh" && f.fanout == Fanout::kLauncher) {
        throw CliError(dashed(name) + " needs --hosts or --hostfile");
      }
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
  Given given;
  read_options(args, given, c);
  for (const char* early : {"help", "version", "print_completion"}) {
    if (auto it = given.find(early); it != given.end()) {
      flag_named(early).apply(c, it->second);
      return c;
    }
  }
  read_environment(getenv, given);
  read_scheduler(getenv, given, c);
  apply_all(given, c);
  check_combination(c);
  return c;
}

}  // namespace ddprun::launcher
