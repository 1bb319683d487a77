// /proc/<pid>/stat, read the one safe way: after the last ')', since the command name in
// parentheses may itself hold spaces and parentheses.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ddprun::agent {

// The fields from proc(5)'s field 3 (state) on, as text: index i is field i + 3. `pid` 0 reads
// this process's own. Empty when the file cannot be read or parsed.
std::vector<std::string> proc_stat_fields(pid_t pid);

}  // namespace ddprun::agent
