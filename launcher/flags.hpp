// The flag table: every flag ddprun knows, one row each. A row says everything about its flag:
// its spellings, its default (named here and nowhere else), the torchrun environment variable
// that stands in for it, the function that validates a value and stores it typed in
// LaunchConfig, what a launch over ssh does with it, and its help line. The CLI parser is a
// loop over this table (cli_parser.cpp); `--help`, `--print-completion` and the flag table in
// launcher/README.md come from it (tests/docs/test_flag_table.py checks the README's).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "launcher/launch_config.hpp"

namespace ddprun::launcher {

// One value of a flag, and where it came from ("--nnodes", "PET_NNODES",
// "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "SLURM_NNODES", "the default"), for error messages.
// A switch's value is "1" (on) or "0" (off).
struct FlagValue {
  std::string value;
  std::string source;
};

// Validates `v` and stores it in the config; throws CliError naming v.source.
using ApplyFlag = void (*)(LaunchConfig& c, const FlagValue& v);

// What a launch over ssh (--hosts/--hostfile) does with a flag the user gave.
enum class Fanout : unsigned char {
  kForward,   // every node gets it as given
  kPerNode,   // the fan-out sets it for each node: the user may not
  kReplaced,  // the fan-out computes each node's value from the user's (--nnodes, ...)
  kLauncher,  // read by the launching ddprun only (--hosts, --ssh-*, --help, ...)
};

struct Flag {
  std::string_view name;           // canonical, underscores: "nproc_per_node"
  char short_name = 0;             // 'm', 'r', 't', 'h', or 0
  bool takes_value = true;         // false: a switch
  std::string_view metavar;        // for --help
  std::string_view default_value;  // applied when no source gives one; "" = none
  std::string_view env;            // torchrun's own variable for it, read after PET_<NAME>
  ApplyFlag apply = nullptr;
  Fanout fanout = Fanout::kForward;
  std::string_view help;   // one line, our own words
  std::string_view group;  // --help section
};

const std::vector<Flag>& flag_table();

// "--nproc-per-node" / "--nproc_per_node" (exact), or an unambiguous prefix of one flag's
// spellings, as argparse allows. Sets `ambiguous` when a prefix matches several flags.
const Flag* find_long_flag(std::string_view spelling, bool& ambiguous);
const Flag* find_short_flag(char c);
const Flag& flag_named(std::string_view name);  // a canonical name from the table

// PET_NPROC_PER_NODE for "nproc_per_node".
std::string pet_variable(std::string_view name);

// "--nproc-per-node" for "nproc_per_node" (how messages name a flag).
std::string dashed(std::string_view name);

}  // namespace ddprun::launcher
