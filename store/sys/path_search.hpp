// Finding a program on a search path (PATH), the one rule for the launcher's entrypoint and
// interpreter and for the tools the agent runs (eu-stack, gdb, py-spy).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ddprun::sys {

// A regular file this process may execute.
bool is_executable_file(const std::string& path);

enum class EmptyEntry {
  kCurrentDirectory,  // as execvp() reads PATH: for what the user asked to run
  kSkipped,           // for tools ddprun runs on its own: never from wherever it was started
};

// The first executable `dir/name` for the directories of `search_path` (colon-separated).
// A `name` with a slash is not searched: it is returned when it is executable.
std::optional<std::string> find_on_path(const std::string& name, std::string_view search_path,
                                        EmptyEntry empty);

}  // namespace ddprun::sys
