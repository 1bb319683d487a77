// The flag table (flags.hpp) is complete, and what is derived from it agrees with it: the
// defaults parse, --help and the completion scripts name every flag, and launcher/README.md's
// flag table is the one the table renders.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "launcher/cli_parser.hpp"
#include "launcher/flags.hpp"
#include "launcher/usage.hpp"

namespace ddprun::launcher {
namespace {

TEST(FlagTable, EveryRowIsComplete) {
  std::set<std::string_view> names;
  std::set<char> shorts;
  const std::set<std::string_view> groups = {"general", "nodes",      "rendezvous", "workers",
                                             "health",  "entrypoint", "logs",       "ssh"};
  for (const Flag& f : flag_table()) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    if (f.short_name) {
      EXPECT_TRUE(shorts.insert(f.short_name).second) << f.name;
    }
    EXPECT_NE(f.apply, nullptr) << f.name;
    EXPECT_FALSE(f.help.empty()) << f.name;
    EXPECT_TRUE(groups.count(f.group)) << f.name;
    EXPECT_EQ(f.takes_value, !f.metavar.empty()) << f.name;
    EXPECT_TRUE(f.takes_value || f.default_value.empty()) << f.name;  // switches are off
    if (!f.default_value.empty()) {
      LaunchConfig c;
      EXPECT_NO_THROW(f.apply(c, FlagValue{std::string(f.default_value), "the default"})) << f.name;
    }
  }
}

// Runs of white space (--help's wrapping) as one space.
std::string folded(const std::string& text) {
  std::string out;
  for (char ch : text) {
    const bool space = ch == ' ' || ch == '\n';
    if (space && !out.empty() && out.back() == ' ') continue;
    out += space ? ' ' : ch;
  }
  return out;
}

TEST(FlagTable, HelpAndCompletionsNameEveryFlag) {
  const std::string help = folded(help_text());
  const std::string bash = completion_script("bash");
  const std::string zsh = completion_script("zsh");
  const std::string tcsh = completion_script("tcsh");
  for (const Flag& f : flag_table()) {
    const std::string spelled = dashed(f.name);
    EXPECT_NE(help.find(spelled), std::string::npos) << spelled;
    EXPECT_NE(help.find(folded(std::string(f.help) + default_text(f))), std::string::npos)
        << spelled;
    EXPECT_NE(bash.find(spelled), std::string::npos) << spelled;
    EXPECT_NE(zsh.find("'" + spelled), std::string::npos) << spelled;
    EXPECT_NE(tcsh.find(spelled.substr(2)), std::string::npos) << spelled;
  }
  EXPECT_NE(bash.find("--rdzv-backend|--rdzv_backend) COMPREPLY=($(compgen -W \"static c10d "
                      "etcd etcd-v2 etcd-v3\""),
            std::string::npos);
}

// The table in launcher/README.md between its markers is flag_table_markdown(), so the docs
// cannot drift from the flags. On a difference the expected table is written next to the test.
TEST(FlagTable, TheReadmeTableIsTheFlagTable) {
  std::ifstream in(DDPRUN_SOURCE_DIR "/launcher/README.md");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  const std::string begin =
      "<!-- flag table: launcher_test renders it from launcher/flag_table.cpp -->\n";
  const std::string end = "<!-- end of the flag table -->";
  const size_t from = readme.find(begin);
  const size_t to = readme.find(end);
  ASSERT_NE(from, std::string::npos) << "launcher/README.md lost its flag table markers";
  ASSERT_NE(to, std::string::npos);
  const std::string table = readme.substr(from + begin.size(), to - from - begin.size());
  const std::string expected = flag_table_markdown();
  if (table != expected) {
    std::ofstream("flag_table.md") << expected;
    FAIL() << "launcher/README.md's flag table is not the flag table's: paste "
              "flag_table.md (written in the test's directory) between the markers";
  }
}

}  // namespace
}  // namespace ddprun::launcher
