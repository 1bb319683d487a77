#include "agent/process/std_streams.hpp"

#include <gtest/gtest.h>

namespace ddprun::agent {
namespace {

TEST(StdSpec, SingleValueAppliesToEveryRank) {
  auto s = StdSpec::parse("3");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->for_rank(0), Std::kAll);
  EXPECT_EQ(s->for_rank(7), Std::kAll);
  EXPECT_FALSE(s->is_map());
}

TEST(StdSpec, MapGivesNoneToMissingRanks) {
  auto s = StdSpec::parse("0:1,1:2,12:3");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->for_rank(0), Std::kOut);
  EXPECT_EQ(s->for_rank(1), Std::kErr);
  EXPECT_EQ(s->for_rank(12), Std::kAll);
  EXPECT_EQ(s->for_rank(2), Std::kNone);
}

TEST(StdSpec, RejectsMalformed) {
  for (const char* bad :
       {"", "4", "-1", "a", "0:", ":1", "0:4", "0:1,", "0:1;1:2", "01", "0:1,x"}) {
    EXPECT_FALSE(StdSpec::parse(bad)) << bad;
  }
}

TEST(StdSpec, BitHelpers) {
  EXPECT_TRUE(has(Std::kAll, Std::kOut));
  EXPECT_TRUE(has(Std::kAll, Std::kErr));
  EXPECT_FALSE(has(Std::kOut, Std::kErr));
  EXPECT_EQ(Std::kOut | Std::kErr, Std::kAll);
}

}  // namespace
}  // namespace ddprun::agent
