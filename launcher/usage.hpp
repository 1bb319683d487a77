// ddprun's --help, usage line and --version text.
#pragma once

#include <string>

namespace ddprun::launcher {

std::string usage_line();
std::string help_text();
std::string version_text();

}  // namespace ddprun::launcher
