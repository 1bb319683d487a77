// Slurm's host list syntax (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST), expanded in Slurm's own
// order: "n[1-3],gpu01" is n1 n2 n3 gpu01; "rack[0-1]-n[01-02]" is the cartesian product with
// the last bracket varying fastest (rack0-n01 rack0-n02 rack1-n01 rack1-n02); a range keeps
// the width of its low end ("n[001-010]" is n001 ... n010; "n[1-10]" is n1 ... n10); a bracket
// holds a comma list of numbers and ranges ("n[1,3,5-7]"). Entries are separated by commas
// outside brackets.
//
// Pure and bounded: the size of the expansion is computed before anything is allocated, and a
// list of more than `max_hosts` names is refused, as are unbalanced or nested brackets, a
// reversed range, a non-numeric range and an empty entry.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

// Slurm itself refuses a range of more than 64K hosts.
inline constexpr std::size_t kMaxHostlistHosts = 65536;

struct Hostlist {
  std::vector<std::string> hosts;  // in Slurm's order; empty when `error` is set
  std::string error;               // one line, e.g. "unbalanced '[' in 'n[1-3'"
};

// Never throws.
Hostlist expand_hostlist(std::string_view text, std::size_t max_hosts = kMaxHostlistHosts);

}  // namespace ddprun::launcher
