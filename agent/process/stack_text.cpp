// The parsers of the stack tools' output: StackDump::head and StackPlace (stack_dump.hpp).
#include "agent/process/stack_text.hpp"

#include <optional>

#include "agent/process/stack_dump.hpp"

namespace ddprun::agent {

namespace stack_text {

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r") + 1 - first);
}

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    auto nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

std::string clip(std::string_view s) {
  if (s.size() <= kMaxHeadLineChars) return std::string(s);
  return std::string(s.substr(0, kMaxHeadLineChars)) + "...";
}

}  // namespace stack_text

namespace {

using stack_text::clip;
using stack_text::split_lines;
using stack_text::trim;

// The index of the first line for which `better` is true, else of the first for which `any`.
template <typename Better, typename Any>
std::optional<size_t> pick_block(const std::vector<std::string_view>& lines, Better better,
                                 Any any) {
  std::optional<size_t> fallback;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!any(lines[i])) continue;
    if (better(lines[i])) return i;
    if (!fallback) fallback = i;
  }
  return fallback;
}

// "#3  0x00007f... in foo (a=1) at x.c:5" (gdb) or "#3  0x00007f... foo" (eu-stack) -> "#3 foo".
std::string native_frame(std::string_view line) {
  auto space = line.find_first_of(" \t");
  std::string number(line.substr(0, space));
  std::string_view rest = space == std::string_view::npos ? "" : trim(line.substr(space));
  if (rest.starts_with("0x")) {
    auto end = rest.find_first_of(" \t");
    rest = end == std::string_view::npos ? "" : trim(rest.substr(end));
    if (rest.starts_with("in ")) rest = trim(rest.substr(3));
  }
  rest = rest.substr(0, rest.find(" ("));  // gdb's arguments and location
  return clip(number + " " + std::string(rest.empty() ? "??" : rest));
}

constexpr size_t kMaxPlaceFrames = 64;  // frames of the main thread read to place it

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// The main thread's frames in eu-stack's (`TID <pid>:` block, else the first) or gdb's
// (`Thread 1 ` / `(LWP <pid>)` block) output, up to `limit`.
std::vector<std::string> native_main_frames(std::string_view output, pid_t pid, size_t limit) {
  const auto lines = split_lines(output);
  const std::string tid = "TID " + std::to_string(pid) + ":";
  const std::string lwp = "(LWP " + std::to_string(pid) + ")";
  auto block = pick_block(
      lines,
      [&](std::string_view l) {
        // gdb lists threads last to first; its thread 1 is the main thread even when the pid
        // does not match (another pid namespace).
        return l == tid || l.find(lwp) != std::string_view::npos || l.starts_with("Thread 1 (");
      },
      [](std::string_view l) { return l.starts_with("TID ") || l.starts_with("Thread "); });
  std::vector<std::string> frames;
  if (!block) return frames;
  for (size_t i = *block + 1; i < lines.size() && frames.size() < limit; ++i) {
    std::string_view l = trim(lines[i]);
    if (!l.starts_with("#")) break;
    frames.push_back(native_frame(l));
  }
  return frames;
}

// py-spy dump: the frames of the thread block named "MainThread", else the block of thread
// `pid`, else the first block, up to `limit`.
std::vector<std::string> python_main_frames(std::string_view pyspy_output, pid_t pid,
                                            size_t limit) {
  const auto lines = split_lines(pyspy_output);
  const std::string own = "Thread " + std::to_string(pid) + " ";
  auto block = pick_block(
      lines,
      [&](std::string_view l) {
        return l.find("\"MainThread\"") != std::string_view::npos || l.starts_with(own);
      },
      [](std::string_view l) { return l.starts_with("Thread "); });
  std::vector<std::string> frames;
  if (!block) return frames;
  size_t indent = 0;
  for (size_t i = *block + 1; i < lines.size() && frames.size() < limit; ++i) {
    std::string_view l = lines[i];
    size_t depth = l.find_first_not_of(" \t");
    if (depth == 0 || depth == std::string_view::npos) break;  // next block or blank
    if (indent == 0) indent = depth;
    if (depth != indent) continue;                   // deeper lines: locals, not frames
    if (contains(l, "(<ddprun-zygote>:")) continue;  // a warm worker's start, not the script's
    frames.push_back(clip(trim(l)));
  }
  return frames;
}

}  // namespace

std::vector<std::string> native_stack_head(std::string_view output, pid_t pid) {
  return native_main_frames(output, pid, kStackHeadLines);
}

std::vector<std::string> python_stack_head(std::string_view pyspy_output, pid_t pid) {
  return python_main_frames(pyspy_output, pid, kStackHeadLines);
}

StackPlace stack_place(std::string_view native_output, std::string_view python_output, pid_t pid) {
  StackPlace place;
  const auto python = python_main_frames(python_output, pid, kMaxPlaceFrames);
  if (!python.empty()) {
    // "all_reduce (torch/distributed/distributed_c10d.py:4174)": innermost first.
    for (const auto& f : python) {
      if (contains(f, "distributed_c10d.py:")) {
        place.where = StackPlace::Where::kInCollective;
        place.op = f.substr(0, f.find(" ("));
        place.frame = f;
        return place;
      }
    }
    place.where = StackPlace::Where::kElsewhere;
    place.frame = python.front();
    return place;
  }
  const auto native = native_main_frames(native_output, pid, kMaxPlaceFrames);
  if (native.empty()) return place;
  for (const auto& f : native) {
    if (contains(f, "c10d::") || contains(f, "gloo::") || contains(f, "nccl")) {
      place.where = StackPlace::Where::kInCollective;
      place.frame = f;
      return place;
    }
  }
  place.where = StackPlace::Where::kElsewhere;
  place.frame = native.front();
  return place;
}

}  // namespace ddprun::agent
