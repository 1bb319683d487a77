#include "store/wait_registry.hpp"

#include <gtest/gtest.h>

#include <memory>

namespace ddprun::store {
namespace {

class CountingWaiter : public Waiter {
 public:
  int wakes = 0;
  std::vector<int>* order = nullptr;
  int id = 0;

 protected:
  void on_wake() override {
    ++wakes;
    if (order) order->push_back(id);
  }
};

std::vector<const std::string*> ptrs(const std::vector<std::string>& keys) {
  std::vector<const std::string*> out;
  for (const auto& k : keys) out.push_back(&k);
  return out;
}

TEST(WaitRegistryTest, WakesOnceEveryKeyIsNotified) {
  WaitRegistry reg;
  CountingWaiter w;
  std::vector<std::string> keys{"a", "b"};
  reg.park(w, ptrs(keys));
  EXPECT_TRUE(w.parked());
  reg.notify_all("a");
  reg.notify_all("a");  // already counted: no effect
  EXPECT_EQ(w.wakes, 0);
  reg.notify_all("b");
  EXPECT_EQ(w.wakes, 1);
  EXPECT_FALSE(w.parked());
  EXPECT_EQ(reg.parked_key_count(), 0u);
}

TEST(WaitRegistryTest, DuplicateKeysCountTwiceButWakeOnce) {
  WaitRegistry reg;
  CountingWaiter w;
  std::vector<std::string> keys{"a", "a"};
  reg.park(w, ptrs(keys));
  reg.notify_all("a");
  EXPECT_EQ(w.wakes, 1);
}

TEST(WaitRegistryTest, CancelUnparksWithoutWaking) {
  WaitRegistry reg;
  CountingWaiter w1, w2;
  std::vector<std::string> keys{"a", "b"};
  reg.park(w1, ptrs(keys));
  reg.park(w2, ptrs(keys));
  reg.cancel(w1);
  EXPECT_FALSE(w1.parked());
  EXPECT_EQ(reg.parked_key_count(), 2u);
  reg.notify_all("a");
  reg.notify_all("b");
  EXPECT_EQ(w1.wakes, 0);
  EXPECT_EQ(w2.wakes, 1);
}

TEST(WaitRegistryTest, DestroyedWaiterIsNeverWoken) {
  WaitRegistry reg;
  std::vector<std::string> keys{"a"};
  CountingWaiter survivor;
  {
    auto gone = std::make_unique<CountingWaiter>();
    reg.park(*gone, ptrs(keys));
    reg.park(survivor, ptrs(keys));
  }
  reg.notify_all("a");  // must not touch the destroyed waiter
  EXPECT_EQ(survivor.wakes, 1);
}

TEST(WaitRegistryTest, NotifyOneWakesInParkingOrder) {
  WaitRegistry reg;
  std::vector<int> order;
  CountingWaiter w[3];
  std::vector<std::string> keys{"q"};
  for (int i = 0; i < 3; ++i) {
    w[i].id = i;
    w[i].order = &order;
    reg.park(w[i], ptrs(keys));
  }
  reg.notify_one("q");
  EXPECT_EQ(order, std::vector<int>{0});
  reg.notify_one("q");
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
  reg.notify_all("q");
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  reg.notify_one("q");  // nobody left
  EXPECT_EQ(order.size(), 3u);
}

TEST(WaitRegistryTest, ManyWaitersOnOneKey) {
  WaitRegistry reg;
  std::vector<std::string> keys{"k"};
  std::vector<std::unique_ptr<CountingWaiter>> ws;
  for (int i = 0; i < 10000; ++i) {
    ws.push_back(std::make_unique<CountingWaiter>());
    reg.park(*ws.back(), ptrs(keys));
  }
  for (int i = 0; i < 10000; i += 2) reg.cancel(*ws[i]);
  reg.notify_all("k");
  int woken = 0;
  for (auto& w : ws) woken += w->wakes;
  EXPECT_EQ(woken, 5000);
}

}  // namespace
}  // namespace ddprun::store
