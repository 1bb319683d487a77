// The linearizability checker (store/testing/): hand-written histories it must accept and
// must reject, its model against StoreState on random operations, and the randomized workload
// against a real ServerThread, whose histories must all be linearizable.
#include "store/testing/linearizability.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "store/server.hpp"
#include "store/store_state.hpp"
#include "store/testing/store_model.hpp"
#include "store/testing/workload.hpp"

namespace ddprun::store::testing {
namespace {

using Keys = std::vector<std::string>;

// Hand-written operations; times are microseconds after an arbitrary origin.
Operation op(int client, OpKind kind, Keys keys, int from, int to) {
  Operation o;
  o.client = client;
  o.kind = kind;
  o.keys = std::move(keys);
  o.outcome = has_no_reply(kind) ? Outcome::kNoReply : Outcome::kReply;
  o.invoked = Clock::time_point(std::chrono::microseconds(from));
  o.responded = Clock::time_point(std::chrono::microseconds(to));
  return o;
}
Operation set(int c, std::string k, std::string v, int from, int to) {
  Operation o = op(c, OpKind::kSet, {std::move(k)}, from, to);
  o.values = {std::move(v)};
  return o;
}
Operation get(int c, std::string k, std::string reply, int from, int to) {
  Operation o = op(c, OpKind::kGet, {std::move(k)}, from, to);
  o.reply = {std::move(reply)};
  return o;
}
Operation add(int c, std::string k, int64_t delta, int64_t result, int from, int to) {
  Operation o = op(c, OpKind::kAdd, {std::move(k)}, from, to);
  o.delta = delta;
  o.number = result;
  return o;
}
Operation cas(int c, std::string k, std::string expected, std::string desired, std::string reply,
              int from, int to) {
  Operation o = op(c, OpKind::kCompareSet, {std::move(k)}, from, to);
  o.values = {std::move(expected), std::move(desired)};
  o.reply = {std::move(reply)};
  return o;
}
Operation with_number(Operation o, int64_t n) {
  o.number = n;
  return o;
}
Operation erase(int c, std::string k, bool erased, int from, int to) {
  return with_number(op(c, OpKind::kDeleteKey, {std::move(k)}, from, to), erased);
}
Operation check(int c, Keys keys, bool present, int from, int to) {
  return with_number(op(c, OpKind::kCheck, std::move(keys), from, to), present);
}
Operation num_keys(int c, int64_t n, int from, int to) {
  return with_number(op(c, OpKind::kNumKeys, {}, from, to), n);
}
Operation wait(int c, Keys keys, int from, int to) {
  return op(c, OpKind::kWait, std::move(keys), from, to);
}
Operation timed_out(Operation o) {
  o.outcome = Outcome::kTimedOut;
  o.reply.clear();
  return o;
}
Operation multi_get(int c, Keys keys, Keys replies, int from, int to) {
  Operation o = op(c, OpKind::kMultiGet, std::move(keys), from, to);
  o.reply = std::move(replies);
  return o;
}
Operation multi_set(int c, Keys keys, Keys values, int from, int to) {
  Operation o = op(c, OpKind::kMultiSet, std::move(keys), from, to);
  o.values = std::move(values);
  return o;
}
Operation push(int c, std::string q, std::string v, int from, int to) {
  Operation o = op(c, OpKind::kQueuePush, {std::move(q)}, from, to);
  o.values = {std::move(v)};
  return o;
}
Operation pop(int c, std::string q, std::optional<std::string> v, int from, int to) {
  Operation o = op(c, OpKind::kQueuePop, {std::move(q)}, from, to);
  if (v) o.reply = {*v};
  return o;
}
Operation queue_len(int c, std::string q, int64_t n, int from, int to) {
  return with_number(op(c, OpKind::kQueueLen, {std::move(q)}, from, to), n);
}

void expect_linearizable(const History& h) {
  CheckResult r = check_linearizable(h);
  EXPECT_TRUE(r.ok()) << r.explanation;
}
void expect_rejected(const History& h) {
  CheckResult r = check_linearizable(h);
  EXPECT_EQ(r.verdict, CheckResult::Verdict::kNotLinearizable) << r.explanation;
}

TEST(LinearizabilityTest, ReadsSeeTheLatestCompletedWrite) {
  expect_linearizable({set(0, "a", "1", 0, 1), get(1, "a", "1", 2, 3)});
  expect_rejected({set(0, "a", "1", 0, 1), get(1, "a", "7", 2, 3)});  // nobody wrote 7
  // A stale read: the second SET was done (its client had a later reply) before the GET.
  History stale{set(0, "a", "1", 0, 1), num_keys(0, 1, 2, 3), set(0, "a", "2", 4, 5),
                num_keys(0, 1, 6, 7)};
  stale.push_back(get(1, "a", "1", 8, 9));
  expect_rejected(stale);
  stale.back() = get(1, "a", "2", 8, 9);
  expect_linearizable(stale);
}

TEST(LinearizabilityTest, AWriteWithoutReplyTakesEffectByItsClientsNextReply) {
  // c0's SET went out at [0, 1]; until c0's next reply (at 9) it may not have been applied.
  History h{set(0, "a", "1", 0, 1), num_keys(0, 1, 8, 9), check(1, {"a"}, false, 4, 5)};
  expect_linearizable(h);
  h.back() = check(1, {"a"}, false, 10, 11);  // after c0's reply: the SET is done
  expect_rejected(h);
  // The last SET of a client, with no later reply, may take effect any time after its call.
  expect_linearizable({set(0, "a", "1", 0, 1), check(1, {"a"}, false, 50, 51)});
}

TEST(LinearizabilityTest, ConcurrentAddsCountEachDelta) {
  expect_linearizable({add(0, "n", 1, 2, 0, 10), add(1, "n", 1, 1, 1, 9)});
  expect_rejected({add(0, "n", 1, 1, 0, 10), add(1, "n", 1, 1, 1, 9)});  // both saw 1
  expect_linearizable({add(0, "n", 0, 0, 0, 1), add(0, "n", -2, -2, 2, 3)});
  // ADD parses like stoll: leading spaces, trailing bytes ignored.
  expect_linearizable({set(0, "n", " 12abc", 0, 1), add(0, "n", 1, 13, 2, 3)});
}

TEST(LinearizabilityTest, CompareSetFourCases) {
  expect_linearizable({cas(0, "k", "", "v1", "v1", 0, 1), cas(0, "j", "old", "new", "old", 2, 3),
                       check(0, {"j"}, false, 4, 5), cas(0, "k", "v1", "v2", "v2", 6, 7),
                       cas(0, "k", "zz", "v3", "v2", 8, 9), get(0, "k", "v2", 10, 11)});
  // Two clients cannot both swap the same expected value.
  History h{set(0, "k", "0", 0, 1), num_keys(0, 1, 2, 3), cas(1, "k", "0", "1", "1", 4, 10),
            cas(2, "k", "0", "2", "2", 4, 10)};
  expect_rejected(h);
  h.back() = cas(2, "k", "0", "2", "1", 4, 10);  // the loser sees the winner's value
  expect_linearizable(h);
}

TEST(LinearizabilityTest, WaitIsReleasedOnlyByAWriteToEachMissingKey) {
  // Released by a SET made while it waited.
  expect_linearizable({wait(0, {"a"}, 0, 10), set(1, "a", "1", 5, 6), num_keys(1, 1, 7, 8)});
  // Nothing wrote "a": the release is impossible.
  expect_rejected({wait(0, {"a"}, 0, 10), set(1, "b", "1", 5, 6), num_keys(1, 1, 7, 8)});
  // The write came only after the WAIT had returned.
  expect_rejected({wait(0, {"a"}, 0, 4), set(1, "a", "1", 5, 6), num_keys(1, 1, 7, 8)});
  // DELETE_KEY wakes nobody.
  expect_rejected({set(0, "a", "1", 0, 1), erase(0, "a", true, 2, 3), wait(1, {"a"}, 4, 20),
                   erase(0, "a", false, 5, 6)});
  // Every missing key must be written, not just one.
  expect_rejected({wait(0, {"a", "b"}, 0, 10), set(1, "a", "1", 5, 6), num_keys(1, 1, 7, 8)});
  // A present key releases it at once; a timed-out WAIT constrains nothing.
  expect_linearizable({set(0, "a", "1", 0, 1), num_keys(0, 1, 2, 3), wait(1, {"a"}, 4, 5)});
  expect_linearizable({timed_out(wait(0, {"a"}, 0, 10))});
}

TEST(LinearizabilityTest, GetWaitsForTheKeyThenReads) {
  expect_linearizable({get(0, "a", "1", 0, 20), set(1, "a", "1", 5, 6), num_keys(1, 1, 7, 8)});
  // GET returns empty only for a key deleted after its WAIT was released.
  expect_rejected({get(0, "a", "", 0, 20), set(1, "a", "1", 5, 6), num_keys(1, 1, 7, 8)});
  expect_linearizable({get(0, "a", "", 0, 20), set(1, "a", "1", 5, 6), erase(1, "a", true, 7, 8)});
  expect_linearizable({timed_out(get(0, "a", "", 0, 20))});
}

TEST(LinearizabilityTest, MultiSetIsAtomic) {
  History h{multi_set(0, {"a", "b"}, {"0", "0"}, 0, 1), num_keys(0, 2, 2, 3),
            multi_set(0, {"a", "b"}, {"1", "1"}, 10, 11), num_keys(0, 2, 12, 13),
            multi_get(1, {"a", "b"}, {"1", "0"}, 9, 14)};
  expect_rejected(h);
  h.back() = multi_get(1, {"a", "b"}, {"1", "1"}, 9, 14);
  expect_linearizable(h);
  h.back() = multi_get(1, {"a", "b"}, {"0", "0"}, 9, 14);
  expect_linearizable(h);
}

TEST(LinearizabilityTest, QueuesWakeOneWaiterAndCountAsPresent) {
  // A push wakes one parked waiter; yet two WAITs released by one push are legal, as the
  // second may have started while the item was queued (a non-empty queue counts as present).
  History one_push{wait(0, {"q"}, 0, 20), wait(1, {"q"}, 1, 20), push(2, "q", "x", 5, 6),
                   queue_len(2, "q", 1, 7, 8)};
  expect_linearizable(one_push);
  one_push[1] = timed_out(one_push[1]);
  expect_linearizable(one_push);
  // An emptied queue is missing again, and only a push to it releases a WAIT.
  expect_rejected({push(0, "q", "x", 0, 1), pop(0, "q", "x", 2, 3), wait(1, {"q"}, 4, 20),
                   set(2, "a", "1", 5, 6), num_keys(2, 1, 7, 8)});
  expect_linearizable({push(0, "q", "x", 0, 1), check(0, {"q"}, true, 2, 3), num_keys(0, 0, 4, 5),
                       pop(0, "q", "x", 6, 7), check(0, {"q"}, false, 8, 9),
                       pop(0, "q", std::nullopt, 10, 11)});
  expect_rejected({push(0, "q", "x", 0, 1), push(0, "q", "y", 2, 3), pop(1, "q", "y", 4, 5)});
}

TEST(LinearizabilityTest, ExplanationNamesTheOffendingOperation) {
  History h{set(0, "a", "1", 0, 1),       num_keys(0, 1, 2, 3), get(1, "b", "5", 0, 30),
            set(2, "b", "4", 4, 5),       num_keys(2, 2, 6, 7), get(0, "a", "1", 8, 9),
            check(0, {"a"}, true, 10, 11)};
  CheckResult r = check_linearizable(h);
  ASSERT_EQ(r.verdict, CheckResult::Verdict::kNotLinearizable);
  EXPECT_NE(r.explanation.find("c1 GET \"b\" -> \"5\""), std::string::npos) << r.explanation;
  // The witness keeps the writes and the one read that cannot be explained.
  EXPECT_NE(r.explanation.find("sub-history of 3 operations"), std::string::npos) << r.explanation;
  std::printf("%s\n", r.explanation.c_str());
}

TEST(LinearizabilityTest, MalformedHistoriesThrow) {
  EXPECT_THROW(check_linearizable({set(0, "a", "1", 0, 5), num_keys(0, 1, 3, 6)}),
               std::invalid_argument);  // one client, overlapping calls
  EXPECT_THROW(check_linearizable({num_keys(0, 0, 5, 3)}), std::invalid_argument);
  EXPECT_THROW(check_linearizable({timed_out(num_keys(0, 0, 0, 1))}), std::invalid_argument);
}

class FlagWaiter : public Waiter {
 public:
  bool woken = false;

 protected:
  void on_wake() override { woken = true; }
};

// Random operations over three names (keys and queues), applied to StoreState and to the
// checker's model side by side.
class ModelAgainstStore {
 public:
  // One random operation on both; its replies must agree.
  void step() {
    const int k = roll(3);
    const std::string& key = names[k];
    const std::string value = roll(8) == 0 ? "x" : std::to_string(roll(6) - 1);
    switch (roll(11)) {
      case 0:
        state.set(key, value);
        model.set(k, value);
        break;
      case 1:
        state.append(key, value);
        model.append(k, value);
        break;
      case 2: {
        int64_t delta = roll(6) - 2;
        ASSERT_EQ(state.add(key, delta), model.add(k, delta));
        break;
      }
      case 3: {
        std::string expected = roll(3) == 0 ? "" : std::to_string(roll(6) - 1);
        ASSERT_EQ(state.compare_set(key, expected, value), model.compare_set(k, expected, value));
        break;
      }
      case 4:
        ASSERT_EQ(state.erase(key), model.erase(k));
        break;
      case 5:
        state.queue_push(key, value);
        model.queue_push(k, value);
        break;
      case 6: {
        auto [length, popped] = state.queue_pop(key);
        auto expected = model.queue_pop(k);
        ASSERT_EQ(length > 0, expected.has_value());
        if (expected) {
          ASSERT_EQ(popped, *expected);
        }
        break;
      }
      case 7:
        ASSERT_EQ(state.queue_len(key), model.queue_len(k));
        ASSERT_EQ(state.num_keys(), model.num_keys());
        break;
      case 8:
        ASSERT_EQ(state.check({key, names[(k + 1) % 3]}), model.check({k, (k + 1) % 3}));
        break;
      default: {
        const int w = roll(2);
        if (waiting[w]) break;
        Keys keys{key};
        std::vector<int> ids{k};
        if (roll(2) == 0) {
          keys.push_back(names[(k + 2) % 3]);
          ids.push_back((k + 2) % 3);
        }
        waiters[w].woken = state.wait(keys, waiters[w]);
        model.wait_start(w, ids);
        waiting[w] = true;
      }
    }
    compare(k);
  }

 private:
  int roll(int n) { return static_cast<int>(rng() % n); }

  // The name's value and the waiters' wake-ups agree after the operation.
  void compare(int k) {
    const std::string& key = names[k];
    const std::string* stored = state.find(key);
    const std::string* modelled = model.find(k);
    ASSERT_EQ(stored != nullptr, modelled != nullptr);
    if (stored) {
      ASSERT_EQ(*stored, *modelled);
    }
    for (int w = 0; w < 2; ++w) {
      if (!waiting[w]) continue;
      ASSERT_EQ(waiters[w].woken, model.wait_released(w)) << "waiter " << w;
      if (waiters[w].woken) {
        model.wait_end(w);
        waiting[w] = false;
      }
    }
  }

  const Keys names{"a", "b", "c"};
  std::mt19937 rng{7};
  StoreState state;
  StoreModel model{names.size()};
  FlagWaiter waiters[2];
  bool waiting[2] = {false, false};
};

// The checker's model must be the store: the same replies and the same wake-ups as
// StoreState for random operations over three names (keys and queues).
TEST(StoreModelTest, AgreesWithStoreState) {
  ModelAgainstStore check;
  for (int i = 0; i < 20000; ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    ASSERT_NO_FATAL_FAILURE(check.step());
  }
}

constexpr int kSeeds = 8;

ServerOptions loopback() {
  ServerOptions options;
  options.host = "127.0.0.1";
  return options;
}

WorkloadOptions workload(uint64_t seed) {
  WorkloadOptions options;
  options.seed = seed;
  options.clients = 4;
  options.ops_per_client = 40;
  return options;
}

CheckOptions bounded() {
  CheckOptions options;
  options.max_states = 1'000'000;
  return options;
}

// Every history our own server produces is one the store's semantics allow. Replace the
// ServerThread's address with another store's (a proxy in front of it) to test that one.
TEST(WorkloadTest, ServerHistoriesAreLinearizable) {
  int timed_out = 0, swapped = 0, popped = 0, released_late = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    ServerThread server(loopback());
    History history = run_workload("127.0.0.1", server.port(), workload(seed));
    ASSERT_EQ(history.size(), 160u);
    auto started = Clock::now();
    CheckResult result = check_linearizable(history, bounded());
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
    ASSERT_TRUE(result.ok()) << "seed " << seed << ": " << result.explanation;
    std::printf("seed %d: %zu operations, checked in %.1f ms (%zu states)\n",
                static_cast<int>(seed), history.size(), ms, result.states);
    for (const Operation& op : history) {
      timed_out += op.outcome == Outcome::kTimedOut;
      swapped += op.kind == OpKind::kCompareSet && op.reply[0] == op.values[1];
      popped += op.kind == OpKind::kQueuePop && !op.reply.empty();
      released_late += op.kind == OpKind::kWait && op.outcome == Outcome::kReply &&
                       op.responded - op.invoked > std::chrono::milliseconds(1);
    }
  }
  // The workload reaches the interesting cases.
  EXPECT_GT(timed_out, 0);
  EXPECT_GT(swapped, 0);
  EXPECT_GT(popped, 0);
  EXPECT_GT(released_late, 0);
}

// The checker is not vacuous on histories of this size: one corrupted reply is caught, and
// the search over a failing history stays within its bound.
TEST(WorkloadTest, CorruptedServerHistoriesAreRejected) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    ServerThread server(loopback());  // the checker assumes a store that starts empty
    const History history = run_workload("127.0.0.1", server.port(), workload(seed + 100));
    for (OpKind kind : {OpKind::kGet, OpKind::kAdd}) {
      History corrupted = history;
      auto it = std::find_if(
          corrupted.begin() + corrupted.size() / 2, corrupted.end(),
          [kind](const Operation& op) { return op.kind == kind && op.outcome == Outcome::kReply; });
      if (it == corrupted.end()) continue;
      if (kind == OpKind::kGet) it->reply[0] = "x999";         // values are numbers
      if (kind == OpKind::kAdd) it->number = -12345678901234;  // far beyond deltas and digits
      CheckResult result = check_linearizable(corrupted, bounded());
      EXPECT_EQ(result.verdict, CheckResult::Verdict::kNotLinearizable) << result.explanation;
      EXPECT_NE(result.explanation.find(kind == OpKind::kGet ? "x999" : "-12345678901234"),
                std::string::npos)
          << result.explanation;
    }
  }
}

}  // namespace
}  // namespace ddprun::store::testing
