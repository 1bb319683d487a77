// ddprun's --help, usage line, --version and --print-completion texts, and the README's flag
// table: all from the flag table (flags.hpp).
#pragma once

#include <string>
#include <string_view>

#include "launcher/flags.hpp"

namespace ddprun::launcher {

std::string usage_line();
std::string help_text();
std::string version_text();
// " (default $TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30)", or "" when the row names none.
std::string default_text(const Flag& flag);
// A completion script for "bash", "zsh" or "tcsh".
std::string completion_script(std::string_view shell);
// The flag table of launcher/README.md, in Markdown (tests/docs/test_flag_table.py).
std::string flag_table_markdown();

}  // namespace ddprun::launcher
