// LineSplitter: cuts a byte stream into whole lines, so tee'd console output is written one
// complete line at a time (never cut or interleaved mid-line with another worker's output).
#pragma once

#include <string>
#include <string_view>

namespace ddprun::agent {

class LineSplitter {
 public:
  // A line longer than `max_line` bytes is emitted in pieces of that size (each with a "\n"
  // added), so a worker printing without newlines cannot make the agent buffer without bound.
  explicit LineSplitter(size_t max_line = 64 * 1024) : max_line_(max_line) {}

  // Calls on_line(line) for every complete line in partial+data; `line` ends with '\n'.
  template <class F>
  void feed(std::string_view data, F&& on_line) {
    while (!data.empty()) {
      size_t nl = data.find('\n');
      if (nl == std::string_view::npos) {
        partial_.append(data);
        while (partial_.size() >= max_line_) {
          std::string piece = partial_.substr(0, max_line_) + '\n';
          partial_.erase(0, max_line_);
          on_line(std::string_view(piece));
        }
        return;
      }
      if (partial_.empty()) {
        on_line(data.substr(0, nl + 1));
      } else {
        partial_.append(data.substr(0, nl + 1));
        on_line(std::string_view(partial_));
        partial_.clear();
      }
      data.remove_prefix(nl + 1);
    }
  }

  // Emits the unterminated rest (with a '\n' added), if any.
  template <class F>
  void flush(F&& on_line) {
    if (partial_.empty()) return;
    partial_ += '\n';
    on_line(std::string_view(partial_));
    partial_.clear();
  }

  size_t buffered() const { return partial_.size(); }

 private:
  size_t max_line_;
  std::string partial_;
};

}  // namespace ddprun::agent
