// Session: request semantics and reply ordering of both dialects, without sockets.
#include "store/session.hpp"

#include <gtest/gtest.h>

#include "store/test_frames.hpp"

namespace ddprun::store {
namespace {

using test::torch2_hello;
using test::v1;
using test::v2;

struct Peer : OutputListener {
  Peer(StoreState& state, Limits limits = {}, OutputBudget* budget = nullptr)
      : session(state, limits, *this, {}, budget) {}
  void on_output() override { ++wakeups; }
  // Feeds bytes; returns whatever output is ready, consuming it.
  std::string send(const std::string& bytes) {
    EXPECT_TRUE(session.feed(bytes)) << session.error();
    return take();
  }
  std::string take() {
    std::string out(session.output());
    session.consume_output(out.size());
    return out;
  }
  Session session;
  int wakeups = 0;
};

std::string i64(int64_t v) {
  std::string s;
  wire::put_i64(s, v);
  return s;
}
std::string bytes(std::string_view v) {
  std::string s;
  wire::put_bytes(s, v);
  return s;
}

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

namespace ddprun::store {
namespace {

std::string u32le(uint32_t v) {
  std::string s;
  wire::put_u32(s, v);
  return s;
}
std::string framed(const std::string& reply) {
  return std::string(1, static_cast<char>(kMuxReply)) + reply;
}
std::string released(uint32_t tag) {
  return std::string(1, static_cast<char>(kMuxRelease)) + u32le(tag);
}

// A proxy's multiplexed connection: replies are framed, tagged waits hold nothing back and their
// releases come as frames of their own.
TEST(SessionMuxTest, TaggedWaitsDoNotHoldRepliesBack) {
  StoreState state;
  Peer proxy(state), other(state);
  proxy.send(torch2_hello());
  other.send(torch2_hello());
  const std::string ack = proxy.send(v2(Op::kMux).i64(0).i64(0));
  ASSERT_EQ(ack.size(), 17u);  // accepted, the new session's id, nothing consumed yet
  EXPECT_EQ(ack[0], '\x01');
  EXPECT_NE(proxy.session.mux_id(), 0u);
  EXPECT_EQ(ack.substr(9), i64(0));
  EXPECT_EQ(proxy.send(v2(Op::kWaitTagged).u32(7).keys({"/a"})), "");
  EXPECT_EQ(proxy.send(v2(Op::kWaitTagged).u32(8).keys({"/a", "/b"})), "");
  EXPECT_EQ(proxy.send(v2(Op::kAdd).str("/n").i64(3)), framed(i64(3)));
  EXPECT_EQ(proxy.send(v2(Op::kSet).str("/x").str("1")), "");
  EXPECT_EQ(other.send(v2(Op::kSet).str("/a").str("1")), "");
  EXPECT_EQ(proxy.wakeups, 1);
  EXPECT_EQ(proxy.take(), released(7));
  // Its own write releases the second: the release follows the write's reply.
  EXPECT_EQ(proxy.send(v2(Op::kCompareSet).str("/b").str("").str("v")),
            framed(bytes("v")) + released(8));
  // Present already: released at once.
  EXPECT_EQ(proxy.send(v2(Op::kWaitTagged).u32(7).keys({"/a"})), released(7));
  // An ADD the store refuses fails alone; the connection stays.
  const std::string failed = proxy.send(v2(Op::kAdd).str("/b").i64(1));
  ASSERT_FALSE(failed.empty());
  EXPECT_EQ(failed[0], static_cast<char>(kMuxFailed));
  EXPECT_NE(failed.find("not a 64-bit decimal integer"), std::string::npos);
  EXPECT_EQ(proxy.send(v2(Op::kGet).str("/b")), framed(bytes("v")));
}

// A store with a proxy's multiplexed connection to it and a plain 2.x client beside it.
struct MuxedStore {
  MuxedStore() {
    proxy.send(torch2_hello());
    other.send(torch2_hello());
    proxy.send(v2(Op::kMux).i64(0).i64(0));
  }
  StoreState state;
  Peer proxy{state}, other{state};
};

TEST(SessionMuxTest, CancelAndBarrierAndErrors) {
  MuxedStore store;
  StoreState& state = store.state;
  Peer &proxy = store.proxy, &other = store.other;
  EXPECT_EQ(proxy.send(v2(Op::kWaitTagged).u32(1).keys({"/k"})), "");
  EXPECT_EQ(proxy.send(v2(Op::kCancelTagged).u32(1)), framed(std::string(1, '\x01')));
  EXPECT_EQ(proxy.send(v2(Op::kCancelTagged).u32(1)), framed(std::string(1, '\x00')));
  other.send(v2(Op::kSet).str("/k").str("1"));
  EXPECT_EQ(proxy.take(), "");  // cancelled: never released
  EXPECT_EQ(proxy.send(v2(Op::kBarrierTagged).u32(2).str("/bar").i64(2)), "");
  EXPECT_EQ(proxy.send(v2(Op::kBarrierTagged).u32(3).str("/bar").i64(2)),
            released(2) + released(3));
  EXPECT_EQ(proxy.send(v2(Op::kWaitTagged).u32(4).keys({"/z"})), "");
  EXPECT_FALSE(proxy.session.feed(v2(Op::kWaitTagged).u32(4).keys({"/z"})));
  EXPECT_NE(proxy.session.error().find("still parked"), std::string::npos);

  Peer plain(state);
  plain.send(torch2_hello());
  EXPECT_FALSE(plain.session.feed(v2(Op::kWaitTagged).u32(1).keys({"/z"})));
  EXPECT_NE(plain.session.error().find("before MUX"), std::string::npos);
  Peer muxed(state);
  muxed.send(torch2_hello() + std::string(v2(Op::kMux).i64(0).i64(0)));
  EXPECT_FALSE(muxed.session.feed(v2(Op::kWait).keys({"/z"})));
  EXPECT_NE(muxed.session.error().find("multiplexed"), std::string::npos);
}

// MULTI_WAIT_TAGGED: one frame, several tagged waits with consecutive tags, each released on
// its own; counts that do not add up to the keys close the connection.
TEST(SessionMuxTest, MultiWaitTaggedParksEachWait) {
  MuxedStore store;
  StoreState& state = store.state;
  Peer &proxy = store.proxy, &other = store.other;
  other.send(v2(Op::kSet).str("/have").str("1"));
  const std::string counts = u32le(2) + u32le(1) + u32le(1);
  EXPECT_EQ(
      proxy.send(v2(Op::kMultiWaitTagged).u32(20).keys({"/a", "/b", "/have", "/b"}).str(counts)),
      released(21));  // the second waits on a key that exists
  other.send(v2(Op::kSet).str("/b").str("1"));
  EXPECT_EQ(proxy.take(), released(22));
  other.send(v2(Op::kSet).str("/a").str("1"));
  EXPECT_EQ(proxy.take(), released(20));
  // Tag 20 is free again; 22 too. A cancelled one is never released.
  EXPECT_EQ(
      proxy.send(v2(Op::kMultiWaitTagged).u32(20).keys({"/x", "/y"}).str(u32le(1) + u32le(1))), "");
  EXPECT_EQ(proxy.send(v2(Op::kCancelTagged).u32(21)), framed(std::string(1, '\x01')));
  other.send(v2(Op::kMultiSet).i64(2).str("/x").str("1").str("/y").str("1"));
  EXPECT_EQ(proxy.take(), released(20));

  EXPECT_FALSE(proxy.session.feed(
      v2(Op::kMultiWaitTagged).u32(30).keys({"/a", "/b"}).str(u32le(1) + u32le(2))));
  EXPECT_NE(proxy.session.error().find("counting 3 keys of 2"), std::string::npos);
  Peer odd(state);
  odd.send(torch2_hello() + std::string(v2(Op::kMux).i64(0).i64(0)));
  EXPECT_FALSE(odd.session.feed(v2(Op::kMultiWaitTagged).u32(1).keys({"/a"}).str("abc")));
  EXPECT_NE(odd.session.error().find("3 bytes of counts"), std::string::npos);
}

// The streams' positions: MUX_SYNC says how much of the requests the store has and drops the
// output the client has; a detached session resumes on another listener from the client's
// position, re-sending what was lost on the way, once.
TEST(SessionMuxTest, ResumesFromTheClientsPosition) {
  StoreState state;
  Peer proxy(state), other(state);
  proxy.send(torch2_hello());
  other.send(torch2_hello());
  proxy.send(v2(Op::kMux).i64(0).i64(0));
  const std::string adds =
      std::string(v2(Op::kAdd).str("/n").i64(1)) + std::string(v2(Op::kAdd).str("/n").i64(1));
  EXPECT_EQ(proxy.send(adds), framed(i64(1)) + framed(i64(2)));
  const std::string sync = v2(Op::kMuxSync).i64(9);  // has the first reply (9 bytes)
  EXPECT_EQ(proxy.send(sync), framed(i64(static_cast<int64_t>(adds.size() + sync.size()))));
  EXPECT_EQ(proxy.send(v2(Op::kWaitTagged).u32(5).keys({"/w"})), "");
  // The connection goes; the session lives on. A release while detached is kept.
  Peer nobody(state);
  proxy.session.detach(nobody);
  other.send(v2(Op::kSet).str("/w").str("1"));
  // The client has 9 bytes: the second ADD's reply, the SYNC's and the release come again.
  Peer next(state);
  ASSERT_TRUE(proxy.session.attach(next, 9));
  const std::string again = proxy.take();
  ASSERT_GE(again.size(), 17u);
  EXPECT_EQ(again.substr(1, 8), i64(static_cast<int64_t>(proxy.session.mux_id())));
  EXPECT_EQ(
      again.substr(17),
      framed(i64(2)) + framed(i64(static_cast<int64_t>(adds.size() + sync.size()))) + released(5));
  EXPECT_FALSE(proxy.session.attach(next, 0));  // those bytes were dropped by the SYNC
  // A new session asking to resume names its id: the connection takes it from there.
  Peer fresh(state);
  fresh.send(torch2_hello());
  EXPECT_EQ(
      fresh.send(std::string(v2(Op::kMux).i64(77).i64(3)) + std::string(v2(Op::kGet).str("/n"))),
      "");
  auto resume = fresh.session.take_resume_request();
  ASSERT_TRUE(resume);
  EXPECT_EQ(resume->id, 77u);
  EXPECT_EQ(resume->received, 3u);
  EXPECT_EQ(resume->rest, std::string(v2(Op::kGet).str("/n")));
}

}  // namespace
}  // namespace ddprun::store
