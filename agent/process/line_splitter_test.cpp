#include "agent/process/line_splitter.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace ddprun::agent {
namespace {

std::vector<std::string> run(LineSplitter& s, std::initializer_list<std::string_view> chunks,
                             bool flush) {
  std::vector<std::string> lines;
  auto on_line = [&](std::string_view l) { lines.emplace_back(l); };
  for (auto c : chunks) s.feed(c, on_line);
  if (flush) s.flush(on_line);
  return lines;
}

TEST(LineSplitter, JoinsPartialLinesAcrossReads) {
  LineSplitter s;
  auto lines = run(s, {"hel", "lo\nwor", "ld\n", "tail"}, false);
  EXPECT_EQ(lines, (std::vector<std::string>{"hello\n", "world\n"}));
  EXPECT_EQ(s.buffered(), 4u);
}

TEST(LineSplitter, FlushAddsNewlineToUnterminatedRest) {
  LineSplitter s;
  auto lines = run(s, {"a\nb"}, true);
  EXPECT_EQ(lines, (std::vector<std::string>{"a\n", "b\n"}));
  EXPECT_EQ(s.buffered(), 0u);
}

TEST(LineSplitter, CapsVeryLongLines) {
  LineSplitter s(4);
  auto lines = run(s, {"abcdefghij"}, true);
  EXPECT_EQ(lines, (std::vector<std::string>{"abcd\n", "efgh\n", "ij\n"}));
}

TEST(LineSplitter, EmptyLinesAreLines) {
  LineSplitter s;
  auto lines = run(s, {"\n\nx\n"}, true);
  EXPECT_EQ(lines, (std::vector<std::string>{"\n", "\n", "x\n"}));
}

}  // namespace
}  // namespace ddprun::agent
