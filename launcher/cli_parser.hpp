// The command-line parser: torchrun's flags (both --dash-spellings and --underscore_ones,
// "--flag=value" and "--flag value", -m, -r, -t, unambiguous prefixes as argparse allows),
// defaults from PET_<FLAG> (booleans read as integers, set-but-empty as on; empty values
// are unset), then from a batch scheduler's variables (scheduler_env.hpp), and every check
// that can be made without looking at the machine. The first non-option argument is the entrypoint;
// it and everything after it are kept verbatim for the workers.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "launcher/launch_config.hpp"

namespace ddprun::launcher {

// Bad input: main() prints the usage and "ddprun: error: <what()>" and exits 2.
class CliError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using GetEnv = std::function<std::optional<std::string>(const std::string& name)>;

// `args` excludes argv[0]. Throws CliError.
LaunchConfig parse_command_line(const std::vector<std::string>& args, const GetEnv& getenv);

// Helpers shared with the launch plan and the tests.
std::optional<long long> parse_int(std::string_view text);
std::vector<std::string> split(std::string_view text, char sep);

}  // namespace ddprun::launcher
