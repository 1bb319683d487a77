#include "agent/template.hpp"

#include <gtest/gtest.h>

namespace ddprun::agent {
namespace {

TEST(SafeSubstitute, LikePythonTemplate) {
  std::map<std::string, std::string> m{{"local_rank", "3"}};
  EXPECT_EQ(safe_substitute("--rank=${local_rank}", m), "--rank=3");
  EXPECT_EQ(safe_substitute("$local_rank/x", m), "3/x");
  EXPECT_EQ(safe_substitute("$local_rankX", m), "$local_rankX");
  EXPECT_EQ(safe_substitute("${other} $HOME $$ $", m), "${other} $HOME $ $");
  EXPECT_EQ(safe_substitute("${local_rank", m), "${local_rank");
  EXPECT_EQ(safe_substitute("a$1b", m), "a$1b");
  EXPECT_EQ(safe_substitute("", m), "");
}

TEST(SafeSubstitute, PrefixTemplate) {
  std::map<std::string, std::string> m{
      {"role_name", "trainer"}, {"local_rank", "0"}, {"rank", "4"}};
  EXPECT_EQ(safe_substitute("[${role_name}${local_rank}]:", m), "[trainer0]:");
  EXPECT_EQ(safe_substitute("${rank}| ", m), "4| ");
}

}  // namespace
}  // namespace ddprun::agent
