// MemoryStore and PrefixStore: each operation's semantics, waits parked across threads, last
// wills (on close, on kill, replaced, cleared), kill during a wait, concurrent adds. Every
// coroutine runs on a TestLoop, whose run time is bounded, so a bug fails instead of hanging.
#include "agent/rendezvous/memory_store.hpp"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>
#include <future>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>

#include "agent/rendezvous/prefix_store.hpp"
#include "store/client.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using store::StoreError;
using Keys = std::vector<std::string>;
using Kind = StoreError::Kind;
template <typename T>
using awaitable = asio::awaitable<T>;
using Millis = std::chrono::milliseconds;

// One thread's io_context. run() runs what was spawned on it for at most `limit` and throws if
// that was not enough, so a lost wake-up fails the test instead of hanging it.
class TestLoop {
 public:
  asio::any_io_executor executor() { return io_.get_executor(); }
  // Starts `body` (a callable returning an awaitable) once run() runs; the future has its
  // result or exception.
  template <typename F>
  auto spawn(F body) {
    return asio::co_spawn(io_, std::move(body), asio::use_future);
  }
  // Runs `f` once every coroutine spawned so far has reached its first suspension.
  template <typename F>
  void after_first_suspension(F f) {
    asio::post(io_, std::move(f));
  }
  void run(Millis limit = 10s) {
    io_.run_for(limit);
    if (!io_.stopped()) throw std::runtime_error("the test's coroutines did not finish in time");
  }

 private:
  asio::io_context io_;
};

// Runs body(executor) on a fresh TestLoop on the calling thread; returns its result.
template <typename F>
auto run_bounded(F body) {
  TestLoop loop;
  auto result = loop.spawn([&body, &loop] { return body(loop.executor()); });
  loop.run();
  return result.get();
}

template <typename T>
T get_within(std::future<T>& f, Millis limit = 10s) {
  if (f.wait_for(limit) != std::future_status::ready) throw std::runtime_error("no answer");
  return f.get();
}

// The store's operations with trivially destructible arguments: GCC 12 miscompiles co_await
// expressions holding temporaries with non-trivial destructors, and these build the strings
// outside of them.
using Sv = std::string_view;
awaitable<int64_t> add(RendezvousStore& s, Sv key, int64_t delta) {
  return s.add(std::string(key), delta);
}
awaitable<std::string> compare_set(RendezvousStore& s, Sv key, Sv expected, Sv desired) {
  return s.compare_set(std::string(key), std::string(expected), std::string(desired));
}
// Keys as separate arguments: GCC 12 also rejects an initializer list inside co_await.
template <typename... K>
awaitable<bool> check(RendezvousStore& s, K... keys) {
  return s.check(Keys{std::string(keys)...});
}
template <typename... K>
awaitable<bool> wait(RendezvousStore& s, Millis timeout, K... keys) {
  return s.wait(Keys{std::string(keys)...}, timeout);
}
template <typename... K>
awaitable<Keys> multi_get(RendezvousStore& s, K... keys) {
  return s.multi_get(Keys{std::string(keys)...});
}
awaitable<void> set(RendezvousStore& s, Sv key, Sv value) {
  return s.set(std::string(key), std::string(value));
}
awaitable<std::string> get(RendezvousStore& s, Sv key, Millis timeout) {
  return s.get(std::string(key), timeout);
}
awaitable<void> set_will(RendezvousStore& s, Sv key, Sv expected, Sv desired) {
  return s.set_will(std::string(key), std::string(expected), std::string(desired));
}

// The kind of StoreError `op()` threw; nullopt if it returned.
template <typename F>
awaitable<std::optional<Kind>> error_of(F op) {
  try {
    co_await op();
  } catch (const StoreError& e) {
    co_return e.kind();
  }
  co_return std::nullopt;
}

TEST(MemoryStoreTest, OperationsKeepTheStoreSemantics) {
  MemoryStore store;
  run_bounded([&](asio::any_io_executor ex) -> awaitable<void> {
    auto c = store.connect(ex);
    EXPECT_EQ(co_await add(*c, "n", 3), 3);  // absent counts as 0
    EXPECT_EQ(co_await add(*c, "n", -5), -2);
    std::string n = co_await get(*c, "n", 1s);
    EXPECT_EQ(n, "-2");  // kept as decimal text
    co_await set(*c, "a", "x");
    std::vector<std::pair<std::string, std::string>> kvs{{"b", "y"}, {"c", ""}};
    co_await c->multi_set(std::move(kvs));
    EXPECT_TRUE(co_await check(*c, "a", "b", "c"));
    EXPECT_FALSE(co_await check(*c, "a", "absent"));
    Keys values = co_await multi_get(*c, "a", "absent", "b", "c");
    EXPECT_EQ(values, (Keys{"x", "", "y", ""}));
    EXPECT_TRUE(co_await wait(*c, 1s));
    EXPECT_TRUE(co_await wait(*c, 1s, "a", "c"));
    // Not a counter: an error, and the store and the client are left as they were.
    EXPECT_EQ(co_await error_of([&] { return add(*c, "a", 1); }), Kind::kProtocol);
    std::string a = co_await get(*c, "a", 1s);
    EXPECT_EQ(a, "x");
  });
}

TEST(MemoryStoreTest, CompareSetFollowsTheTable) {
  MemoryStore store;
  run_bounded([&](asio::any_io_executor ex) -> awaitable<void> {
    auto c = store.connect(ex);
    // Absent and expected non-empty: nothing, the reply is `expected`.
    std::string absent_expected = co_await compare_set(*c, "k", "old", "new");
    EXPECT_EQ(absent_expected, "old");
    EXPECT_FALSE(co_await check(*c, "k"));
    // Absent and expected empty: created.
    std::string created = co_await compare_set(*c, "k", "", "v1");
    EXPECT_EQ(created, "v1");
    // Present and different: nothing, the reply is the current value.
    std::string not_empty = co_await compare_set(*c, "k", "", "v2");
    EXPECT_EQ(not_empty, "v1");
    std::string different = co_await compare_set(*c, "k", "other", "v2");
    EXPECT_EQ(different, "v1");
    // Present and equal: replaced.
    std::string replaced = co_await compare_set(*c, "k", "v1", "v2");
    EXPECT_EQ(replaced, "v2");
    std::string stored = co_await get(*c, "k", 1s);
    EXPECT_EQ(stored, "v2");
  });
}

TEST(MemoryStoreTest, WaitWakesWhenAnotherThreadWritesLater) {
  MemoryStore store;
  std::promise<void> parked;
  auto waiter = std::async(std::launch::async, [&] {
    TestLoop loop;
    auto c = store.connect(loop.executor());
    // No deadline: a lost wake-up runs into the loop's limit.
    auto woken =
        loop.spawn([&]() -> awaitable<bool> { co_return co_await wait(*c, 0ms, "a", "b"); });
    loop.after_first_suspension([&] { parked.set_value(); });
    loop.run();
    return woken.get();
  });
  auto parked_future = parked.get_future();
  get_within(parked_future);
  run_bounded([&](asio::any_io_executor ex) -> awaitable<void> {
    auto c = store.connect(ex);
    co_await set(*c, "a", "1");
    co_await add(*c, "b", 1);
  });
  EXPECT_TRUE(get_within(waiter));
}

TEST(MemoryStoreTest, WaitReturnsFalseAtItsDeadlineAndTheClientStaysUsable) {
  MemoryStore store;
  run_bounded([&](asio::any_io_executor ex) -> awaitable<void> {
    auto c = store.connect(ex);
    auto other = store.connect(ex);
    EXPECT_FALSE(co_await wait(*c, 50ms, "late"));
    try {
      co_await get(*c, "late", 50ms);
      ADD_FAILURE() << "get() of an absent key returned";
    } catch (const StoreError& e) {
      EXPECT_EQ(e.kind(), Kind::kTimeout);
      EXPECT_STREQ(e.what(), "timed out after 0.05 s waiting for 'late'");
    }
    // The timed-out waits left nothing parked behind: this write wakes nobody.
    co_await set(*other, "late", "here");
    EXPECT_TRUE(co_await wait(*c, 50ms, "late"));
    std::string late = co_await get(*c, "late", 50ms);
    EXPECT_EQ(late, "here");
  });
}

TEST(MemoryStoreTest, KillAppliesTheWillAndEndsTheKilledClientsWait) {
  MemoryStore store;
  std::promise<void> survivor_parked;
  std::promise<RendezvousStore*> victim_parked;
  auto survivor = std::async(std::launch::async, [&] {
    TestLoop loop;
    auto c = store.connect(loop.executor());
    auto change = loop.spawn([&]() -> awaitable<std::string> {
      EXPECT_TRUE(co_await wait(*c, 0ms, "change"));  // no deadline: only the will ends it
      std::string change = co_await get(*c, "change", 1s);
      co_return change;
    });
    loop.after_first_suspension([&] { survivor_parked.set_value(); });
    loop.run();
    return change.get();
  });
  auto victim = std::async(std::launch::async, [&] {
    TestLoop loop;
    auto c = store.connect(loop.executor());
    auto errors = loop.spawn([&]() -> awaitable<std::vector<std::optional<Kind>>> {
      co_await set_will(*c, "change", "", "dead:victim");
      std::vector<std::optional<Kind>> errors;
      errors.push_back(co_await error_of([&] { return wait(*c, 0ms, "never"); }));
      errors.push_back(co_await error_of([&] { return add(*c, "n", 1); }));
      co_return errors;
    });
    loop.after_first_suspension([&] { victim_parked.set_value(c.get()); });
    loop.run();
    return errors.get();
  });
  auto survivor_parked_future = survivor_parked.get_future();
  get_within(survivor_parked_future);
  auto victim_parked_future = victim_parked.get_future();
  RendezvousStore* victim_client = get_within(victim_parked_future);
  EXPECT_TRUE(store.kill(*victim_client));
  EXPECT_FALSE(store.kill(*victim_client));  // the will applies once
  EXPECT_EQ(get_within(survivor), "dead:victim");
  EXPECT_EQ(get_within(victim), (std::vector<std::optional<Kind>>{Kind::kClosed, Kind::kClosed}));
}

TEST(MemoryStoreTest, CloseOrDestroyEndsAParkedWaitOnTheSameExecutor) {
  MemoryStore store;
  TestLoop loop;
  auto closed = store.connect(loop.executor());
  auto destroyed = store.connect(loop.executor());
  auto closed_error =
      loop.spawn([&] { return error_of([&] { return wait(*closed, 0ms, "never"); }); });
  auto destroyed_error =
      loop.spawn([&] { return error_of([&] { return wait(*destroyed, 0ms, "never"); }); });
  loop.after_first_suspension([&] {
    closed->close();
    destroyed.reset();
  });
  loop.run();
  EXPECT_EQ(closed_error.get(), Kind::kClosed);
  EXPECT_EQ(destroyed_error.get(), Kind::kClosed);
}

TEST(MemoryStoreTest, WillIsReplacedClearedAndAppliedOnce) {
  MemoryStore store;
  run_bounded([&](asio::any_io_executor ex) -> awaitable<void> {
    auto observer = store.connect(ex);
    auto replaced = store.connect(ex);
    co_await set_will(*replaced, "w1", "", "a");
    co_await set_will(*replaced, "w2", "", "b");
    replaced->close();
    replaced->close();
    EXPECT_FALSE(store.kill(*replaced));
    EXPECT_EQ(co_await error_of([&] { return check(*replaced, "w2"); }), Kind::kClosed);
    Keys wills = co_await multi_get(*observer, "w1", "w2");
    EXPECT_EQ(wills, (Keys{"", "b"}));
    EXPECT_FALSE(co_await check(*observer, "w1"));

    auto cleared = store.connect(ex);
    co_await set_will(*cleared, "w3", "", "c");
    co_await set_will(*cleared, "", "", "");
    cleared.reset();
    EXPECT_FALSE(co_await check(*observer, "w3"));

    // The will is a COMPARE_SET: it leaves a value it does not expect alone.
    co_await set(*observer, "w4", "alive");
    auto mismatched = store.connect(ex);
    co_await set_will(*mismatched, "w4", "other", "dead");
    EXPECT_TRUE(store.kill(*mismatched));
    std::string w4 = co_await get(*observer, "w4", 1s);
    EXPECT_EQ(w4, "alive");
  });
}

TEST(MemoryStoreTest, ConcurrentAddsFromEightThreadsSumUp) {
  constexpr int kThreads = 8;
  constexpr int kAdds = 200;
  MemoryStore store;
  std::vector<std::future<std::vector<int64_t>>> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.push_back(std::async(std::launch::async, [&] {
      return run_bounded([&](asio::any_io_executor ex) -> awaitable<std::vector<int64_t>> {
        auto c = store.connect(ex);
        std::vector<int64_t> sums;
        for (int i = 0; i < kAdds; ++i) sums.push_back(co_await add(*c, "counter", 1));
        co_return sums;
      });
    }));
  }
  std::set<int64_t> seen;
  for (auto& t : threads) {
    for (int64_t sum : get_within(t)) seen.insert(sum);
  }
  // Every add saw a distinct sum: none was lost or counted twice.
  EXPECT_EQ(seen.size(), static_cast<size_t>(kThreads * kAdds));
  EXPECT_EQ(*seen.begin(), 1);
  EXPECT_EQ(*seen.rbegin(), kThreads * kAdds);
  int64_t total = run_bounded([&](asio::any_io_executor ex) -> awaitable<int64_t> {
    auto c = store.connect(ex);
    co_return co_await add(*c, "counter", 0);
  });
  EXPECT_EQ(total, kThreads * kAdds);
}

TEST(PrefixStoreTest, PrefixesEveryKeyIncludingTheWills) {
  MemoryStore store;
  run_bounded([&](asio::any_io_executor ex) -> awaitable<void> {
    auto raw = store.connect(ex);
    PrefixStore job(store.connect(ex), "/ddprun/job/");
    co_await set(job, "a", "1");
    EXPECT_EQ(co_await add(job, "n", 2), 2);
    std::string c = co_await compare_set(job, "c", "", "x");
    EXPECT_EQ(c, "x");
    Keys full = co_await multi_get(*raw, "/ddprun/job/a", "/ddprun/job/n", "/ddprun/job/c");
    EXPECT_EQ(full, (Keys{"1", "2", "x"}));
    EXPECT_FALSE(co_await check(*raw, "a"));

    co_await set(*raw, "/ddprun/job/w", "v");
    EXPECT_TRUE(co_await check(job, "w", "a"));
    EXPECT_TRUE(co_await wait(job, 1s, "w"));
    EXPECT_FALSE(co_await wait(job, 10ms, "/ddprun/job/w"));
    Keys short_names = co_await multi_get(job, "w", "a");
    EXPECT_EQ(short_names, (Keys{"v", "1"}));
    try {
      co_await get(job, "missing", 10ms);
      ADD_FAILURE() << "get() of an absent key returned";
    } catch (const StoreError& e) {
      EXPECT_STREQ(e.what(),
                   "timed out after 0.01 s waiting for 'missing'");  // as the caller named it
    }

    co_await set_will(job, "change", "", "dead");
    job.close();
    std::string will = co_await get(*raw, "/ddprun/job/change", 1s);
    EXPECT_EQ(will, "dead");
    EXPECT_FALSE(co_await check(*raw, "change"));

    PrefixStore cleared(store.connect(ex), "/ddprun/job/");
    co_await set_will(cleared, "gone", "", "dead");
    co_await set_will(cleared, "", "", "");
    EXPECT_TRUE(store.kill(cleared.inner()));
    EXPECT_FALSE(co_await check(*raw, "/ddprun/job/gone"));
    EXPECT_FALSE(co_await check(*raw, "gone"));
    EXPECT_FALSE(co_await check(*raw, "/ddprun/job/"));  // the empty key was not prefixed
    EXPECT_EQ(co_await error_of([&] { return check(cleared, "a"); }), Kind::kClosed);
  });
}

}  // namespace
}  // namespace ddprun::agent
