// Session on a proxy's multiplexed connection (MUX): framed replies, tagged waits and their
// releases, MULTI_WAIT_TAGGED, resuming from the client's position.
#include <gtest/gtest.h>

#include "store/session.hpp"
#include "store/session_test_util.hpp"

namespace ddprun::store {
namespace {

using test::bytes;
using test::i64;
using test::Peer;
using test::torch2_hello;
using test::v2;

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

// A session resumed again before the previous resume's answer left the store (the connection
// that took it died, or its proxy moved on, first): the new connection gets one answer and the
// stream, not the unsent rest of the earlier answer as if it were stream bytes.
TEST(SessionMuxTest, AnUnsentAnswerIsNotResentAsStream) {
  StoreState state;
  Peer proxy(state);
  proxy.send(torch2_hello());
  proxy.send(v2(Op::kMux).i64(0).i64(0));
  EXPECT_EQ(proxy.send(v2(Op::kAdd).str("/n").i64(1)), framed(i64(1)));
  Peer nobody(state), second(state), third(state);
  proxy.session.detach(nobody);
  ASSERT_TRUE(proxy.session.attach(second, 9));  // its answer stays unsent
  proxy.session.detach(nobody);
  ASSERT_TRUE(proxy.session.attach(third, 9));
  const std::string answer = proxy.take();
  ASSERT_EQ(answer.size(), 17u);
  EXPECT_EQ(static_cast<uint8_t>(answer[0]), kExtensionAck);
  // And the stream goes on from there.
  EXPECT_EQ(proxy.send(v2(Op::kAdd).str("/n").i64(1)), framed(i64(2)));
}

}  // namespace
}  // namespace ddprun::store
