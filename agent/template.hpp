// Python's string.Template.safe_substitute, which torchrun applies to every worker argument
// (with local_rank) and to the console line prefix (--log-line-prefix-template): "${name}" and
// "$name" are replaced when `name` is known, "$$" becomes "$", anything else is kept as is.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace ddprun::agent {

std::string safe_substitute(std::string_view text,
                            const std::map<std::string, std::string>& values);

}  // namespace ddprun::agent
