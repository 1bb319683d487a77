// POSIX shell quoting for the command a remote login shell runs, and the reverse split for
// --ssh-command / --ssh-options. Pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

// `word` as one word for sh/bash/zsh/dash: left bare when it holds only characters no shell
// treats specially, else in single quotes with each ' written as '\''. The empty word is ''.
std::string shell_quote(std::string_view word);

// The words joined by spaces, each quoted.
std::string shell_join(const std::vector<std::string>& words);

// Splits like a shell (blanks separate words; '...' literal; "..." with \" \\ \$ \` escapes;
// a backslash outside quotes escapes the next character). No expansion of any kind. Throws
// CliError naming `flag` for an unterminated quote or a trailing backslash.
std::vector<std::string> split_shell_words(std::string_view text, const std::string& flag);

}  // namespace ddprun::launcher
