// The text helpers of the stack dumps (stack_dump.cpp runs the tools, stack_text.cpp reads
// their output). Internal to agent/process.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent::stack_text {

inline constexpr size_t kMaxHeadLineChars = 160;

// Without leading blanks and trailing blanks or CR.
std::string_view trim(std::string_view s);
std::vector<std::string_view> split_lines(std::string_view text);
// At most kMaxHeadLineChars, "..." marking a cut.
std::string clip(std::string_view s);

}  // namespace ddprun::agent::stack_text
