// The flag table: every torchrun flag ddprun knows, its spellings and its help line. The CLI
// parser, `--help` and the PET_<FLAG> lookup all come from this one table.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

struct Flag {
  std::string_view name;     // canonical, underscores: "nproc_per_node"
  char short_name;           // 'm', 'r', 't', 'h', or 0
  bool takes_value;          // false: a boolean switch
  std::string_view metavar;  // for --help
  std::string_view help;     // one line, our own words
  std::string_view group;    // --help section
};

const std::vector<Flag>& flag_table();

// "--nproc-per-node" / "--nproc_per_node" (exact), or an unambiguous prefix of one flag's
// spellings, as argparse allows. Sets `ambiguous` when a prefix matches several flags.
const Flag* find_long_flag(std::string_view spelling, bool& ambiguous);
const Flag* find_short_flag(char c);

// PET_NPROC_PER_NODE for "nproc_per_node".
std::string pet_variable(std::string_view name);

// "--nproc-per-node" for "nproc_per_node" (how messages name a flag).
std::string dashed(std::string_view name);

}  // namespace ddprun::launcher
