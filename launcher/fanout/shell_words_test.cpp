#include "launcher/fanout/shell_words.hpp"

#include <gtest/gtest.h>

#include "launcher/cli_parser.hpp"

namespace ddprun::launcher {
namespace {

TEST(ShellQuote, Table) {
  struct Case {
    const char* word;
    const char* quoted;
  } cases[] = {
      {"train.py", "train.py"},
      {"/opt/bin/ddprun", "/opt/bin/ddprun"},
      {"--lr=0.1", "'--lr=0.1'"},
      {"", "''"},
      {"a b", "'a b'"},
      {"it's", "'it'\\''s'"},
      {"$HOME", "'$HOME'"},
      {"${local_rank}", "'${local_rank}'"},
      {"\"q\"", "'\"q\"'"},
      {"a;rm -rf /", "'a;rm -rf /'"},
      {"`x`", "'`x`'"},
      {"*", "'*'"},
      {"~", "'~'"},
      {"a\nb", "'a\nb'"},
      {"10.0.0.1:29500", "10.0.0.1:29500"},
  };
  for (const auto& c : cases) EXPECT_EQ(shell_quote(c.word), c.quoted) << c.word;
}

TEST(ShellQuote, RoundTripsThroughTheSplitter) {
  std::vector<std::string> words = {"a b", "it's", "$X", "", "\\", "\"", "x=y", "'"};
  EXPECT_EQ(split_shell_words(shell_join(words), "t"), words);
}

TEST(SplitShellWords, Table) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_shell_words("", "t"), V{});
  EXPECT_EQ(split_shell_words("  -i key   -o A=b ", "t"), (V{"-i", "key", "-o", "A=b"}));
  EXPECT_EQ(split_shell_words("-i '/my keys/id' -o \"X=a b\"", "t"),
            (V{"-i", "/my keys/id", "-o", "X=a b"}));
  EXPECT_EQ(split_shell_words("a\\ b \"c\\\"d\" e''f", "t"), (V{"a b", "c\"d", "ef"}));
  EXPECT_EQ(split_shell_words("'$HOME'", "t"), (V{"$HOME"}));
}

TEST(SplitShellWords, Errors) {
  EXPECT_THROW(split_shell_words("-i 'key", "--ssh-options"), CliError);
  EXPECT_THROW(split_shell_words("\"x", "--ssh-options"), CliError);
  EXPECT_THROW(split_shell_words("x\\", "--ssh-options"), CliError);
}

}  // namespace
}  // namespace ddprun::launcher
