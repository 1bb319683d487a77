// Session: request semantics and reply ordering of both dialects, without sockets (the
// multiplexed connection of a proxy: session_mux_test.cpp).
#include "store/session.hpp"

#include <gtest/gtest.h>

#include "store/session_test_util.hpp"

namespace ddprun::store {
namespace {

using test::bytes;
using test::i64;
using test::Peer;
using test::torch2_hello;
using test::v1;
using test::v2;

TEST(SessionTest, Torch2HandshakeAndBasicOps) {
  StoreState state;
  Peer p(state);
  EXPECT_EQ(p.send(torch2_hello() + std::string(v2(Op::kPing).u32(0x01020304))),
            std::string("\x04\x03\x02\x01", 4));
  EXPECT_EQ(p.session.dialect(), Dialect::kTorch2);
  EXPECT_EQ(p.send(v2(Op::kSet).str("/a").str("1")), "");
  EXPECT_EQ(p.send(v2(Op::kGet).str("/a")), bytes("1"));
  EXPECT_EQ(p.send(v2(Op::kGet).str("/missing")), bytes(""));
  EXPECT_EQ(p.send(v2(Op::kAdd).str("/c").i64(2)), i64(2));
  EXPECT_EQ(p.send(v2(Op::kGetNumKeys)), i64(2));
  EXPECT_EQ(p.send(v2(Op::kCheck).keys({"/a", "/c"})), std::string(1, '\x00'));
  EXPECT_EQ(p.send(v2(Op::kCheck).keys({"/a", "/x"})), std::string(1, '\x01'));
  EXPECT_EQ(p.send(v2(Op::kDeleteKey).str("/a")), i64(1));
  EXPECT_EQ(p.send(v2(Op::kDeleteKey).str("/a")), i64(0));
  EXPECT_EQ(p.send(v2(Op::kAppend).str("/c").str("0")), "");
  EXPECT_EQ(p.send(v2(Op::kMultiGet).keys({"/c", "/none"})), bytes("20") + bytes(""));
  EXPECT_EQ(p.send(v2(Op::kListKeys)), i64(1) + bytes("/c"));
  EXPECT_EQ(p.send(v2(Op::kQueuePop).str("q")), i64(0));
  p.send(v2(Op::kQueuePush).str("q").str("item"));
  EXPECT_EQ(p.send(v2(Op::kQueueLen).str("q")), i64(1));
  EXPECT_EQ(p.send(v2(Op::kQueuePop).str("q")), i64(1) + bytes("item"));
}

TEST(SessionTest, WaitRepliesLaterAndHoldsFollowingReplies) {
  StoreState state;
  Peer waiter(state), setter(state);
  waiter.send(torch2_hello());
  setter.send(torch2_hello());
  EXPECT_EQ(waiter.send(v2(Op::kWait).keys({"k"})), "");
  EXPECT_TRUE(waiter.session.waiting());
  // A pipelined request behind the WAIT is processed, but its reply waits for the 0x00.
  EXPECT_EQ(waiter.send(v2(Op::kGetNumKeys)), "");
  setter.send(v2(Op::kSet).str("k").str("v"));
  EXPECT_EQ(waiter.wakeups, 1);
  EXPECT_EQ(waiter.take(), std::string(1, '\x00') + i64(0));
}

// A pipelined COMPARE_SET of the key the session itself waits for releases its own WAIT while
// the reply is being written (found by store_session_fuzz: the reply went to freed memory).
TEST(SessionTest, CompareSetReleasingItsOwnWaitRepliesAfterTheWakeByte) {
  StoreState state;
  Peer p(state);
  p.send(torch2_hello());
  EXPECT_EQ(p.send(v2(Op::kWait).keys({"k"})), "");
  EXPECT_EQ(p.send(v2(Op::kCompareSet).str("k").str("").str("v")),
            std::string(1, '\x00') + bytes("v"));
  EXPECT_FALSE(p.session.waiting());
  EXPECT_EQ(p.send(v2(Op::kGet).str("k")), bytes("v"));
}

TEST(SessionTest, CancelWaitBeforeRelease) {
  StoreState state;
  Peer p(state), setter(state);
  p.send(torch2_hello());
  setter.send(torch2_hello());
  p.send(v2(Op::kWait).keys({"k"}));
  EXPECT_EQ(p.send(v2(Op::kCancelWait)), std::string(1, '\x01'));
  setter.send(v2(Op::kSet).str("k").str("v"));  // no late 0x00
  EXPECT_EQ(p.wakeups, 0);
  EXPECT_EQ(p.take(), "");
  EXPECT_EQ(p.send(v2(Op::kCancelWait)), std::string(1, '\x01'));  // nothing pending: still 01
}

TEST(SessionTest, CancelWaitRacingTheReleaseGivesZeroThenOne) {
  StoreState state;
  Peer p(state), setter(state);
  p.send(torch2_hello());
  setter.send(torch2_hello());
  p.send(v2(Op::kWait).keys({"k"}));
  setter.send(v2(Op::kSet).str("k").str("v"));  // 0x00 queued, not yet read by the client
  EXPECT_TRUE(p.session.feed(v2(Op::kCancelWait)));
  EXPECT_EQ(p.take(), std::string("\x00\x01", 2));
}

TEST(SessionTest, SecondWaitWhilePendingIsAnErrorInTorch2) {
  StoreState state;
  Peer p(state);
  p.send(torch2_hello());
  p.send(v2(Op::kWait).keys({"k"}));
  EXPECT_FALSE(p.session.feed(v2(Op::kWait).keys({"j"})));
  EXPECT_EQ(p.session.error(), "WAIT while this connection's previous WAIT is still pending");
}

TEST(SessionTest, Torch1NewRequestCancelsThePendingWaitSilently) {
  StoreState state;
  Peer p(state), setter(state);
  EXPECT_EQ(p.send(v1(Op::kWait).keys({"/k"})), "");  // the 1.13 client times out here...
  EXPECT_EQ(p.session.dialect(), Dialect::kTorch1);
  EXPECT_EQ(p.send(v1(Op::kGetNumKeys)), i64(0));  // ...and moves on: reply at once
  EXPECT_FALSE(p.session.waiting());
  setter.send(v1(Op::kSet).str("/k").str("v"));
  EXPECT_EQ(p.take(), "");  // the late STOP_WAITING byte is never sent
  EXPECT_EQ(p.wakeups, 0);
  // A new WAIT on a 1.13 connection replaces the old one.
  p.send(v1(Op::kWait).keys({"/j"}));
  EXPECT_EQ(p.send(v1(Op::kWait).keys({"/k"})), std::string(1, '\x00'));
}

TEST(SessionTest, Torch1Ops) {
  StoreState state;
  Peer p(state);
  EXPECT_EQ(p.send(v1(Op::kAdd).str("init/").i64(1)), i64(1));
  EXPECT_EQ(p.send(v1(Op::kSet).str("/k").str("v")), "");
  EXPECT_EQ(p.send(v1(Op::kWait).keys({"/k"})), std::string(1, '\x00'));
  EXPECT_EQ(p.send(v1(Op::kGet).str("/k")), bytes("v"));
  EXPECT_EQ(p.send(v1(Op::kCompareSet).str("/k").str("v").str("w")), bytes("w"));
  EXPECT_EQ(p.send(v1(Op::kWatchKey).str("/k")), std::string(1, '\x03'));
  EXPECT_EQ(p.send(v1(Op::kCheck).keys({"/k"})), std::string(1, '\x00'));
  EXPECT_EQ(p.send(v1(Op::kGetNumKeys)), i64(2));
  EXPECT_EQ(p.send(v1(Op::kDeleteKey).str("/k")), i64(1));
}

TEST(SessionTest, BarrierRepliesWhenAllArrived) {
  StoreState state;
  Peer a(state), b(state);
  a.send(torch2_hello());
  b.send(torch2_hello());
  EXPECT_EQ(a.send(v2(Op::kBarrier).str("bar").i64(2)), "");
  EXPECT_EQ(b.send(v2(Op::kBarrier).str("bar").i64(2)), std::string(1, '\x00'));
  EXPECT_EQ(a.take(), std::string(1, '\x00'));
}

TEST(SessionTest, ImpossibleRequestsCloseWithAReason) {
  StoreState state;
  Peer setter(state);
  setter.send(v1(Op::kSet).str("/text").str("hello"));
  Peer p(state);
  EXPECT_FALSE(p.session.feed(v1(Op::kAdd).str("/text").i64(1)));
  EXPECT_EQ(p.session.error(),
            "ADD 1 on key '/text' whose value is not a 64-bit decimal integer (or the sum "
            "overflows)");
  Peer q(state);
  EXPECT_FALSE(q.session.feed(torch2_hello() + std::string(v2(Op::kValidate).u32(7))));
  EXPECT_EQ(q.session.error(), "VALIDATE with a wrong magic number");
  Peer r(state);
  EXPECT_FALSE(r.session.feed(std::string(v1(Op::kGetNumKeys)) + "\x30"));
  EXPECT_EQ(r.session.error(), "unknown opcode 0x30 in the torch-1.13 dialect");
}

// Replies held behind a parked WAIT count as queued output: past kMaxQueued the session stops
// reading requests, and goes on once the WAIT is released and the client reads.
TEST(SessionTest, RepliesHeldBehindAWaitAreBounded) {
  StoreState state;
  Peer p(state), setter(state);
  const std::string big(8 << 20, 'x');
  p.send(torch2_hello() + std::string(v2(Op::kSet).str("big").str(big)));
  setter.send(torch2_hello());
  p.send(v2(Op::kWait).keys({"never"}));
  std::string gets;
  for (int i = 0; i < 9; ++i) gets += v2(Op::kGet).str("big");
  EXPECT_TRUE(p.session.feed(gets));
  EXPECT_TRUE(p.session.paused());
  EXPECT_EQ(p.session.buffered(), big.size() + 8);  // one reply held, eight requests wait
  setter.send(v2(Op::kSet).str("never").str("now"));
  std::string out = p.take();
  while (p.session.paused()) {
    ASSERT_TRUE(p.session.resume()) << p.session.error();
    out += p.take();
  }
  std::string want(1, '\x00');
  for (int i = 0; i < 9; ++i) want += bytes(big);
  EXPECT_EQ(out, want);
}

TEST(SessionTest, ClosingWhileParkedUnparks) {
  StoreState state;
  {
    Peer p(state);
    p.send(torch2_hello() + std::string(v2(Op::kWait).keys({"k"})));
    EXPECT_EQ(state.parked_key_count(), 1u);
  }
  EXPECT_EQ(state.parked_key_count(), 0u);
  Peer setter(state);
  setter.send(v1(Op::kSet).str("k").str("v"));  // must not touch the closed session
}

TEST(SessionTest, LastWillIsAppliedOnceWhenTheConnectionEnds) {
  StoreState state;
  Peer watcher(state);
  watcher.send(torch2_hello() + std::string(v2(Op::kWait).keys({"change"})));
  {
    Peer agent(state);
    const std::string ack(1, static_cast<char>(kExtensionAck));
    EXPECT_EQ(
        agent.send(torch2_hello() + std::string(v2(Op::kSetWill).str("old").str("").str("x"))),
        ack);
    // A new will replaces the previous one.
    EXPECT_EQ(agent.send(v2(Op::kSetWill).str("change").str("").str("dead:a")), ack);
    EXPECT_EQ(state.find("change"), nullptr);  // nothing happens while it is open
    agent.session.fire_will();
    agent.session.fire_will();  // once only
  }
  EXPECT_EQ(*state.find("change"), "dead:a");
  EXPECT_EQ(state.find("old"), nullptr);
  EXPECT_EQ(watcher.wakeups, 1);
  EXPECT_EQ(watcher.take(), std::string(1, '\x00'));
}

TEST(SessionTest, LastWillIsACompareSetAndCanBeCleared) {
  StoreState state;
  state.set("change", "done");
  Peer a(state);
  a.send(torch2_hello() + std::string(v2(Op::kSetWill).str("change").str("").str("dead:a")));
  a.session.fire_will();
  EXPECT_EQ(*state.find("change"), "done");  // the first event stays
  Peer b(state);
  b.send(torch2_hello() + std::string(v2(Op::kSetWill).str("other").str("").str("dead:b")));
  b.send(v2(Op::kSetWill).str("").str("").str(""));  // cleared
  b.session.fire_will();
  EXPECT_EQ(state.find("other"), nullptr);
}

struct KeepAlivePeer : Peer {
  using Peer::Peer;
  void on_keep_alive(int64_t interval_ms, uint32_t probes) override {
    calls.emplace_back(interval_ms, probes);
  }
  std::vector<std::pair<int64_t, uint32_t>> calls;
};

TEST(SessionTest, KeepAliveReachesTheConnectionAndBadValuesClose) {
  StoreState state;
  KeepAlivePeer p(state);
  EXPECT_EQ(p.send(torch2_hello() + std::string(v2(Op::kKeepAlive).i64(1500).u32(3))),
            std::string(1, static_cast<char>(kExtensionAck)));
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0], std::make_pair(int64_t{1500}, uint32_t{3}));
  EXPECT_FALSE(p.session.feed(v2(Op::kKeepAlive).i64(0).u32(3)));
  EXPECT_EQ(p.session.error(), "KEEP_ALIVE with interval 0 ms and 3 probes");
}

// Back-pressure: a client that asks for large replies and does not read them is stopped at the
// request that does not fit, and goes on, from exactly there, once it reads.
TEST(SessionTest, UnreadRepliesStopAtTheBudgetAndResumeWhereTheyStopped) {
  StoreState state;
  OutputBudget budget(3 << 20);
  Peer setter(state, {}, &budget);
  Peer greedy(state, {}, &budget);
  setter.send(torch2_hello() + std::string(v2(Op::kSet).str("big").str(std::string(1 << 20, 'x'))));
  std::string requests = torch2_hello();
  for (int i = 0; i < 10; ++i) requests += v2(Op::kGet).str("big");
  requests += v2(Op::kPing).u32(7);
  ASSERT_TRUE(greedy.session.feed(requests));
  // 64 KiB free, then 3 MiB of budget and at most 4 MiB per connection: a few replies of
  // 1 MiB fit (the output buffer doubles as it grows), then the rest waits.
  EXPECT_TRUE(greedy.session.paused());
  const size_t queued = greedy.session.output().size();
  EXPECT_GE(queued, (1u << 20) + 8);
  EXPECT_LE(queued, 3 * ((1u << 20) + 8));
  EXPECT_EQ(queued % ((1u << 20) + 8), 0u);  // whole replies only
  EXPECT_GT(budget.used(), 0u);
  EXPECT_LE(budget.used(), budget.limit());
  ASSERT_TRUE(greedy.session.resume());  // nothing was read yet: still paused
  EXPECT_TRUE(greedy.session.paused());
  std::string all = greedy.take();  // the client reads: the budget comes back
  EXPECT_EQ(budget.used(), 0u);
  while (greedy.session.paused()) {
    ASSERT_TRUE(greedy.session.resume()) << greedy.session.error();
    all += greedy.take();
  }
  std::string want;
  for (int i = 0; i < 10; ++i) want += bytes(std::string(1 << 20, 'x'));
  want += std::string("\x07\x00\x00\x00", 4);
  EXPECT_EQ(all, want);  // every reply, in order, each once
  EXPECT_EQ(budget.used(), 0u);
}

TEST(SessionTest, ReplyLargerThanTheWholeBudgetClosesTheConnection) {
  StoreState state;
  OutputBudget budget(4 << 20);
  Peer p(state, {}, &budget);
  p.send(torch2_hello() + std::string(v2(Op::kSet).str("big").str(std::string(1 << 20, 'x'))));
  std::vector<std::string> names(8, "big");
  EXPECT_FALSE(p.session.feed(v2(Op::kMultiGet).keys(names)));
  EXPECT_NE(p.session.error().find("MULTI_GET whose reply of 8388672 bytes exceeds the server's "
                                   "whole output budget of 4194304 bytes"),
            std::string::npos)
      << p.session.error();
  EXPECT_EQ(budget.used(), 0u);
}

// Without a budget (or within it) a connection still holds at most about kMaxQueued.
TEST(SessionTest, OneConnectionQueuesAtMostItsCap) {
  StoreState state;
  Peer setter(state), greedy(state);
  setter.send(torch2_hello() + std::string(v2(Op::kSet).str("v").str(std::string(3 << 20, 'y'))));
  std::string requests = torch2_hello();
  for (int i = 0; i < 5; ++i) requests += v2(Op::kGet).str("v");
  ASSERT_TRUE(greedy.session.feed(requests));
  EXPECT_TRUE(greedy.session.paused());
  EXPECT_EQ(greedy.session.output().size(),
            (3u << 20) + 8);  // one reply; a second would pass 4 MiB
  greedy.take();
  ASSERT_TRUE(greedy.session.resume());
  EXPECT_EQ(greedy.session.output().size(), (3u << 20) + 8);
}

}  // namespace
}  // namespace ddprun::store
