// The variables a launch over ssh sends to every node: `--export NAME[,NAME=VALUE...]` and
// `.ddprunenv` files (DeepSpeed's `.deepspeed_env`): one `NAME=value` per line, the value
// verbatim to the end of the line (no quotes removed, nothing expanded), `#` lines and blank
// lines skipped, an optional leading `export `.
//
// Lookup: $DDPRUN_ENV_FILE alone when it is set (it must exist); else ~/.ddprunenv and then
// ./.ddprunenv, both when present, the current directory's values overriding the home's.
// --export overrides both.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "launcher/cli_parser.hpp"

namespace ddprun::launcher {

using EnvList = std::vector<std::pair<std::string, std::string>>;  // in order, names unique

// Throws CliError ("FILE:LINE: ...") for a line that is not NAME=value.
EnvList parse_env_file(std::string_view text, const std::string& source);

// Sets or replaces `name` in `env`, keeping the first position.
void set_env(EnvList& env, const std::string& name, const std::string& value);

bool valid_env_name(std::string_view name);

// Reads a whole file; nullopt when it does not exist. Throws CliError when it exists but
// cannot be read.
using ReadFile = std::function<std::optional<std::string>(const std::string& path)>;
std::optional<std::string> read_text_file(const std::string& path);

// The files' variables then the --export ones (values of bare names from `getenv`; a name
// that is unset there is left out with a notice). `cwd` and `home` locate the files.
EnvList collect_exports(const std::vector<std::string>& exports, const GetEnv& getenv,
                        const ReadFile& read_file, const std::string& cwd,
                        std::vector<std::string>& notices);

}  // namespace ddprun::launcher
