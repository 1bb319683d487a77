#include "store/store_state.hpp"

#include <gtest/gtest.h>

namespace ddprun::store {
namespace {

class FlagWaiter : public Waiter {
 public:
  bool woken = false;

 protected:
  void on_wake() override { woken = true; }
};

TEST(ParseCounterTest, LikeStoll) {
  EXPECT_EQ(parse_counter("42"), 42);
  EXPECT_EQ(parse_counter("-7"), -7);
  EXPECT_EQ(parse_counter("+3"), 3);
  EXPECT_EQ(parse_counter("  12"), 12);
  EXPECT_EQ(parse_counter("12abc"), 12);
  EXPECT_EQ(parse_counter("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(parse_counter("9223372036854775808"), std::nullopt);
  EXPECT_EQ(parse_counter(""), std::nullopt);
  EXPECT_EQ(parse_counter("abc"), std::nullopt);
  EXPECT_EQ(parse_counter("-"), std::nullopt);
}

TEST(StoreStateTest, SetGetEraseNumKeys) {
  StoreState s;
  s.set("a", "1");
  s.set("a", "2");
  ASSERT_NE(s.find("a"), nullptr);
  EXPECT_EQ(*s.find("a"), "2");
  EXPECT_EQ(s.num_keys(), 1);
  EXPECT_TRUE(s.erase("a"));
  EXPECT_FALSE(s.erase("a"));
  EXPECT_EQ(s.find("a"), nullptr);
}

TEST(StoreStateTest, AddCountsInAsciiDecimal) {
  StoreState s;
  EXPECT_EQ(s.add("c", 0), 0);
  EXPECT_EQ(s.add("c", 5), 5);
  EXPECT_EQ(s.add("c", -8), -3);
  EXPECT_EQ(*s.find("c"), "-3");
  s.set("text", "hello");
  EXPECT_EQ(s.add("text", 1), std::nullopt);
  EXPECT_EQ(*s.find("text"), "hello");
  s.set("big", "9223372036854775807");
  EXPECT_EQ(s.add("big", 1), std::nullopt);
}

TEST(StoreStateTest, CompareSetFourCasesAndWakes) {
  StoreState s;
  FlagWaiter w;
  EXPECT_FALSE(s.wait({"k"}, w));
  EXPECT_EQ(s.compare_set("k", "x", "y"), "x");  // absent, expected given: no change
  EXPECT_FALSE(w.woken);
  EXPECT_EQ(s.find("k"), nullptr);
  EXPECT_EQ(s.compare_set("k", "", "v1"), "v1");  // absent, expected empty: created
  EXPECT_TRUE(w.woken);
  EXPECT_EQ(s.compare_set("k", "v1", "v2"), "v2");    // equal: swapped
  EXPECT_EQ(s.compare_set("k", "nope", "v3"), "v2");  // different: current
  EXPECT_EQ(*s.find("k"), "v2");
}

TEST(StoreStateTest, WaitParksOnMissingKeysOnly) {
  StoreState s;
  s.set("a", "1");
  FlagWaiter w;
  EXPECT_TRUE(s.wait({"a"}, w));
  EXPECT_FALSE(w.parked());
  EXPECT_FALSE(s.wait({"a", "b"}, w));
  EXPECT_EQ(s.parked_key_count(), 1u);
  s.set("a", "again");  // not a parked key
  EXPECT_FALSE(w.woken);
  s.append("b", "x");
  EXPECT_TRUE(w.woken);
}

TEST(StoreStateTest, DeleteDoesNotWakeAndAddDoes) {
  StoreState s;
  FlagWaiter w;
  EXPECT_FALSE(s.wait({"k"}, w));
  s.erase("k");
  EXPECT_FALSE(w.woken);
  s.add("k", 1);
  EXPECT_TRUE(w.woken);
}

TEST(StoreStateTest, CheckSeesKeysAndNonEmptyQueues) {
  StoreState s;
  EXPECT_TRUE(s.check({}));
  EXPECT_FALSE(s.check({"q"}));
  s.queue_push("q", "item");
  EXPECT_TRUE(s.check({"q"}));
  EXPECT_EQ(s.num_keys(), 0);
}

TEST(StoreStateTest, QueuesAreFifoAndWakeOneWaiter) {
  StoreState s;
  FlagWaiter w1, w2;
  EXPECT_FALSE(s.wait({"q"}, w1));
  EXPECT_FALSE(s.wait({"q"}, w2));
  s.queue_push("q", "a");
  EXPECT_TRUE(w1.woken);
  EXPECT_FALSE(w2.woken);
  s.queue_push("q", "b");
  EXPECT_TRUE(w2.woken);
  EXPECT_EQ(s.queue_len("q"), 2);
  EXPECT_EQ(s.queue_pop("q"), (std::pair<int64_t, std::string>{2, "a"}));
  EXPECT_EQ(s.queue_pop("q"), (std::pair<int64_t, std::string>{1, "b"}));
  EXPECT_EQ(s.queue_pop("q"), (std::pair<int64_t, std::string>{0, ""}));
  EXPECT_EQ(s.queue_len("q"), 0);
}

TEST(StoreStateTest, BarrierReleasesAtWorldSize) {
  StoreState s;
  FlagWaiter r0, r1, r2, watcher;
  EXPECT_FALSE(s.wait({"bar"}, watcher));
  EXPECT_EQ(s.barrier("bar", 3, r0), StoreState::BarrierResult::kWaiting);
  EXPECT_TRUE(watcher.woken);  // the counter now exists
  EXPECT_FALSE(r0.woken);
  EXPECT_EQ(s.barrier("bar", 3, r1), StoreState::BarrierResult::kWaiting);
  EXPECT_FALSE(r0.woken);
  EXPECT_EQ(s.barrier("bar", 3, r2), StoreState::BarrierResult::kReleased);
  EXPECT_TRUE(r0.woken);
  EXPECT_TRUE(r1.woken);
  EXPECT_FALSE(r2.parked());
  EXPECT_EQ(*s.find("bar"), "3");
  s.set("bad", "x");
  EXPECT_EQ(s.barrier("bad", 2, r2), StoreState::BarrierResult::kBadCounter);
}

TEST(StoreStateTest, ListKeysExcludesQueues) {
  StoreState s;
  s.set("a", "");
  s.set("b", "");
  s.queue_push("q", "");
  std::vector<std::string> keys;
  s.for_each_key([&](const std::string& k) { keys.push_back(k); });
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "b"}));
}

}  // namespace
}  // namespace ddprun::store
