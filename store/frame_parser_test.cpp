#include "store/frame_parser.hpp"

#include <gtest/gtest.h>

#include "store/test_frames.hpp"

namespace ddprun::store {
namespace {

using test::torch2_hello;
using test::v1;
using test::v2;

// Feeds `stream` in pieces of `chunk` bytes (0 = all at once); returns the requests, and
// the error if the stream failed.
struct Parsed {
  std::vector<Request> requests;
  std::string error;
  Dialect dialect = Dialect::kUnknown;
};

Parsed parse(const std::string& stream, size_t chunk = 0, const Limits& limits = Limits{}) {
  FrameParser parser(limits);
  Parsed out;
  size_t pos = 0;
  while (pos < stream.size() && !parser.failed()) {
    size_t n = chunk == 0 ? stream.size() - pos : std::min(chunk, stream.size() - pos);
    std::string_view piece(stream.data() + pos, n);
    while (!piece.empty()) {
      piece.remove_prefix(parser.feed(piece));
      if (parser.failed()) break;
      if (parser.ready()) out.requests.push_back(parser.take());
    }
    pos += n;
  }
  out.error = parser.error();
  out.dialect = parser.dialect();
  return out;
}

std::string torch2_stream() {
  return torch2_hello() + std::string(v2(Op::kPing).u32(0xDEADBEEF)) +
         std::string(v2(Op::kSet).str("/k").str("value")) +
         std::string(v2(Op::kCompareSet).str("/k").str("value").str("v2")) +
         std::string(v2(Op::kAdd).str("init/").i64(-3)) +
         std::string(v2(Op::kWait).keys({"/a", "/b"})) +
         std::string(v2(Op::kMultiSet).i64(2).str("x").str("1").str("y").str("")) +
         std::string(v2(Op::kMultiGet).keys({"x", "y"})) + std::string(v2(Op::kCancelWait)) +
         std::string(v2(Op::kQueuePush).str("q").str("item")) +
         std::string(v2(Op::kBarrier).str("bar").i64(4)) + std::string(v2(Op::kListKeys));
}

void expect_torch2_requests(const Parsed& p) {
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.dialect, Dialect::kTorch2);
  ASSERT_EQ(p.requests.size(), 11u);
  EXPECT_EQ(p.requests[0].op, Op::kPing);
  EXPECT_EQ(p.requests[0].word, 0xDEADBEEFu);
  EXPECT_EQ(p.requests[1].op, Op::kSet);
  EXPECT_EQ(p.requests[1].keys, std::vector<std::string>{"/k"});
  EXPECT_EQ(p.requests[1].values, std::vector<std::string>{"value"});
  EXPECT_EQ(p.requests[2].values, (std::vector<std::string>{"value", "v2"}));
  EXPECT_EQ(p.requests[3].op, Op::kAdd);
  EXPECT_EQ(p.requests[3].integer, -3);
  EXPECT_EQ(p.requests[4].keys, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(p.requests[5].keys, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(p.requests[5].values, (std::vector<std::string>{"1", ""}));
  EXPECT_EQ(p.requests[6].op, Op::kMultiGet);
  EXPECT_EQ(p.requests[7].op, Op::kCancelWait);
  EXPECT_EQ(p.requests[8].op, Op::kQueuePush);
  EXPECT_EQ(p.requests[9].op, Op::kBarrier);
  EXPECT_EQ(p.requests[9].integer, 4);
  EXPECT_EQ(p.requests[10].op, Op::kListKeys);
}

TEST(FrameParserTest, Torch2PipelinedInOneRead) {
  expect_torch2_requests(parse(torch2_stream()));
}

TEST(FrameParserTest, Torch2SplitAtEveryByte) {
  for (size_t chunk : {1, 2, 3, 5, 7, 13}) {
    SCOPED_TRACE(chunk);
    expect_torch2_requests(parse(torch2_stream(), chunk));
  }
}

TEST(FrameParserTest, Torch2EverySplitPointInTwo) {
  std::string s = torch2_stream();
  for (size_t cut = 1; cut < s.size(); ++cut) {
    FrameParser parser(Limits{});
    std::vector<Request> got;
    for (std::string_view piece :
         {std::string_view(s).substr(0, cut), std::string_view(s).substr(cut)}) {
      while (!piece.empty()) {
        piece.remove_prefix(parser.feed(piece));
        ASSERT_FALSE(parser.failed()) << parser.error();
        if (parser.ready()) got.push_back(parser.take());
      }
    }
    ASSERT_EQ(got.size(), 11u) << "cut at " << cut;
  }
}

std::string torch1_stream() {
  return std::string(v1(Op::kAdd).str("init/").i64(1)) +
         std::string(v1(Op::kSet).str("//worker/attempt_0/default_pg/0/0/1").str("addr")) +
         std::string(v1(Op::kWait).keys({"/k"})) + std::string(v1(Op::kGet).str("/k")) +
         std::string(v1(Op::kCheck).keys({"/k", "/j"})) + std::string(v1(Op::kGetNumKeys)) +
         std::string(v1(Op::kWatchKey).str("/w")) + std::string(v1(Op::kDeleteKey).str("/k")) +
         std::string(v1(Op::kCompareSet).str("/c").str("").str("d"));
}

TEST(FrameParserTest, Torch1SplitAndPipelined) {
  for (size_t chunk : {0, 1, 4, 9}) {
    Parsed p = parse(torch1_stream(), chunk);
    ASSERT_EQ(p.error, "");
    EXPECT_EQ(p.dialect, Dialect::kTorch1);
    ASSERT_EQ(p.requests.size(), 9u);
    std::vector<Op> ops;
    for (auto& r : p.requests) ops.push_back(r.op);
    EXPECT_EQ(ops,
              (std::vector<Op>{Op::kAdd, Op::kSet, Op::kWait, Op::kGet, Op::kCheck, Op::kGetNumKeys,
                               Op::kWatchKey, Op::kDeleteKey, Op::kCompareSet}));
    EXPECT_EQ(p.requests[1].keys[0], "//worker/attempt_0/default_pg/0/0/1");
    EXPECT_EQ(p.requests[8].values, (std::vector<std::string>{"", "d"}));
  }
}

// A 1.13 SET also starts with 0x00; only the full 2.x magic selects the 2.x dialect.
TEST(FrameParserTest, Torch1SetStartingLikeTheHello) {
  std::string set = v1(Op::kSet).str(std::string(0xCE, 'k')).str("v");  // length byte 0xCE
  for (size_t chunk : {0, 1, 2}) {
    Parsed p = parse(set + std::string(v1(Op::kGetNumKeys)), chunk);
    ASSERT_EQ(p.error, "");
    EXPECT_EQ(p.dialect, Dialect::kTorch1);
    ASSERT_EQ(p.requests.size(), 2u);
    EXPECT_EQ(p.requests[0].keys[0].size(), 0xCEu);
  }
}

TEST(FrameParserTest, PartialMagicThenMismatchIsTorch1) {
  // 00 CE F7 85 3D...: a 1.13 SET whose key length is 0x...3D85F7CE: over the key limit.
  std::string s("\x00\xCE\xF7\x85\x3D\x00\x00\x00\x00", 9);
  Parsed p = parse(s, 1);
  EXPECT_EQ(p.dialect, Dialect::kTorch1);
  EXPECT_NE(p.error.find("SET key of 1032189902 bytes exceeds the 8192-byte limit"),
            std::string::npos)
      << p.error;
}

TEST(FrameParserTest, EmptyFieldsAndEmptyKeyList) {
  Parsed p = parse(torch2_hello() + std::string(v2(Op::kSet).str("").str("")) +
                   std::string(v2(Op::kWait).keys({})) + std::string(v2(Op::kMultiSet).i64(0)));
  ASSERT_EQ(p.error, "");
  ASSERT_EQ(p.requests.size(), 3u);
  EXPECT_EQ(p.requests[0].keys, std::vector<std::string>{""});
  EXPECT_TRUE(p.requests[1].keys.empty());
  EXPECT_TRUE(p.requests[2].keys.empty());
}

TEST(FrameParserTest, UnknownOpcodes) {
  EXPECT_EQ(parse("\x09").error, "unknown opcode 0x09 in the torch-1.13 dialect");
  EXPECT_EQ(parse(torch2_hello() + "\x13").error, "unknown opcode 0x13 in the torch-2.x dialect");
  EXPECT_EQ(parse(torch2_hello() + "\xFF").error, "unknown opcode 0xFF in the torch-2.x dialect");
  EXPECT_EQ(parse("\x0D").error, "unknown opcode 0x0D in the torch-1.13 dialect");  // PING: 2.x
}

Limits small_limits() {
  Limits l;
  l.max_key = 4;
  l.max_value = 8;
  l.max_keys = 2;
  return l;
}

TEST(FrameParserTest, LimitsAreCheckedWhenTheLengthArrives) {
  Limits l = small_limits();
  std::string h = torch2_hello();
  // Only the length is sent: the parser must reject it without waiting for the bytes.
  EXPECT_EQ(parse(h + std::string(v2(Op::kGet).u64(5)), 0, l).error,
            "GET key of 5 bytes exceeds the 4-byte limit");
  EXPECT_EQ(parse(h + std::string(v2(Op::kSet).str("k").u64(9)), 0, l).error,
            "SET value of 9 bytes exceeds the 8-byte limit");
  EXPECT_EQ(parse(h + std::string(v2(Op::kWait).u64(3)), 0, l).error,
            "WAIT with 3 keys exceeds the 2-key limit");
  EXPECT_EQ(parse(h + std::string(v2(Op::kMultiSet).i64(-1)), 0, l).error,
            "MULTI_SET with -1 keys exceeds the 2-key limit");
  EXPECT_EQ(parse(h + std::string(v2(Op::kCompareSet).str("k").str("").u64(~0ull)), 0, l).error,
            "COMPARE_SET value of 18446744073709551615 bytes exceeds the 8-byte limit");
  EXPECT_EQ(parse(std::string(v1(Op::kCheck).u64(1ull << 40)), 0, l).error,
            "CHECK with 1099511627776 keys exceeds the 2-key limit");
  // Exactly at the limits is fine.
  Parsed ok = parse(
      h + std::string(v2(Op::kMultiSet).i64(2).str("kkkk").str("12345678").str("k").str("")), 1, l);
  EXPECT_EQ(ok.error, "");
  EXPECT_EQ(ok.requests.size(), 1u);
}

TEST(FrameParserTest, DefaultLimitsMatchTorch) {
  std::string h = torch2_hello();
  EXPECT_EQ(parse(h + std::string(v2(Op::kGet).u64(8193))).error,
            "GET key of 8193 bytes exceeds the 8192-byte limit");
  EXPECT_EQ(parse(h + std::string(v2(Op::kAppend).str("k").u64((8 << 20) + 1))).error,
            "APPEND value of 8388609 bytes exceeds the 8388608-byte limit");
  EXPECT_EQ(parse(h + std::string(v2(Op::kMultiGet).u64((128 << 10) + 1))).error,
            "MULTI_GET with 131073 keys exceeds the 131072-key limit");
}

TEST(FrameParserTest, FailureIsSticky) {
  FrameParser parser(Limits{});
  std::string bad = "\x42";
  parser.feed(bad);
  ASSERT_TRUE(parser.failed());
  EXPECT_EQ(parser.feed(std::string(v1(Op::kGetNumKeys))), 0u);
  EXPECT_TRUE(parser.failed());
  EXPECT_FALSE(parser.ready());
}

TEST(FrameParserTest, FrameBoundaryAndTakeResets) {
  FrameParser parser(Limits{});
  std::string s = torch2_hello() + std::string(v2(Op::kGet).str("abc"));
  EXPECT_EQ(parser.feed(std::string_view(s).substr(0, 7)), 7u);
  EXPECT_FALSE(parser.at_frame_boundary());
  parser.feed(std::string_view(s).substr(7));
  ASSERT_TRUE(parser.ready());
  Request r = parser.take();
  EXPECT_EQ(r.keys[0], "abc");
  EXPECT_TRUE(parser.at_frame_boundary());
}

TEST(FrameParserTest, StopsAfterEachRequest) {
  FrameParser parser(Limits{});
  std::string two = std::string(v1(Op::kGetNumKeys)) + std::string(v1(Op::kGetNumKeys));
  EXPECT_EQ(parser.feed(two), 1u);
  EXPECT_TRUE(parser.ready());
  parser.take();
  EXPECT_EQ(parser.feed(std::string_view(two).substr(1)), 1u);
  EXPECT_TRUE(parser.ready());
}

TEST(FrameParserTest, OpcodeTables) {
  EXPECT_EQ(torch2_opcode(Op::kValidate), 0x00);
  EXPECT_EQ(torch2_opcode(Op::kSet), 0x01);
  EXPECT_EQ(torch2_opcode(Op::kDeleteKey), 0x08);
  EXPECT_EQ(torch2_opcode(Op::kCancelWait), 0x0C);
  EXPECT_EQ(torch2_opcode(Op::kPing), 0x0D);
  EXPECT_EQ(torch2_opcode(Op::kListKeys), 0x11);
  EXPECT_EQ(torch2_opcode(Op::kBarrier), 0x12);
  EXPECT_EQ(torch1_opcode(Op::kSet), 0x00);
  EXPECT_EQ(torch1_opcode(Op::kWatchKey), 0x07);
  EXPECT_EQ(torch1_opcode(Op::kDeleteKey), 0x08);
  EXPECT_THROW(torch2_opcode(Op::kWatchKey), std::invalid_argument);
  EXPECT_THROW(torch1_opcode(Op::kAppend), std::invalid_argument);
  // ddprun's extensions: 0x40+ in the 2.x numbering only.
  EXPECT_EQ(torch2_opcode(Op::kSetWill), 0x40);
  EXPECT_EQ(torch2_opcode(Op::kKeepAlive), 0x41);
  EXPECT_EQ(decode_opcode(Dialect::kTorch2, 0x40)->op, Op::kSetWill);
  EXPECT_EQ(decode_opcode(Dialect::kTorch2, 0x41)->op, Op::kKeepAlive);
  EXPECT_EQ(torch2_opcode(Op::kAuth), 0x42);
  EXPECT_EQ(torch2_opcode(Op::kAuthProof), 0x43);
  EXPECT_EQ(decode_opcode(Dialect::kTorch2, 0x42)->op, Op::kAuth);
  EXPECT_EQ(decode_opcode(Dialect::kTorch2, 0x43)->op, Op::kAuthProof);
  // The multiplexed connection's ops (a store proxy's), 2.x only.
  const Op mux_ops[] = {Op::kMux,          Op::kWaitTagged, Op::kBarrierTagged,
                        Op::kCancelTagged, Op::kMuxSync,    Op::kMultiWaitTagged};
  for (uint8_t i = 0; i < 6; ++i) {
    EXPECT_EQ(torch2_opcode(mux_ops[i]), 0x44 + i);
    EXPECT_EQ(decode_opcode(Dialect::kTorch2, static_cast<uint8_t>(0x44 + i))->op, mux_ops[i]);
    EXPECT_THROW(torch1_opcode(mux_ops[i]), std::invalid_argument);
  }
  EXPECT_EQ(decode_opcode(Dialect::kTorch2, 0x4A), nullptr);
  EXPECT_EQ(decode_opcode(Dialect::kTorch1, 0x44), nullptr);
  EXPECT_THROW(torch1_opcode(Op::kSetWill), std::invalid_argument);
  EXPECT_THROW(torch1_opcode(Op::kAuth), std::invalid_argument);
}

// MUX's two integers land in integer and integer2; the tagged ops' tag in word.
TEST(FrameParserTest, MuxOpsCarryTheirFields) {
  auto p = parse(torch2_hello() + std::string(v2(Op::kMux).i64(7).i64(-2)) +
                 std::string(v2(Op::kWaitTagged).u32(9).keys({"a", "b"})) +
                 std::string(v2(Op::kBarrierTagged).u32(10).str("k").i64(4)) +
                 std::string(v2(Op::kMuxSync).i64(100)) +
                 std::string(v2(Op::kMultiWaitTagged).u32(11).keys({"c", "d", "e"}).str("xy")));
  ASSERT_EQ(p.requests.size(), 5u) << p.error;
  EXPECT_EQ(p.requests[0].integer, 7);
  EXPECT_EQ(p.requests[0].integer2, -2);
  EXPECT_EQ(p.requests[1].word, 9u);
  EXPECT_EQ(p.requests[1].keys, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(p.requests[2].word, 10u);
  EXPECT_EQ(p.requests[2].keys[0], "k");
  EXPECT_EQ(p.requests[2].integer, 4);
  EXPECT_EQ(p.requests[3].integer, 100);
  EXPECT_EQ(p.requests[4].word, 11u);
  EXPECT_EQ(p.requests[4].keys, (std::vector<std::string>{"c", "d", "e"}));
  EXPECT_EQ(p.requests[4].values, (std::vector<std::string>{"xy"}));
}

TEST(FrameParserTest, ExtensionOpsParseIn2xOnly) {
  auto p = parse(torch2_hello() + std::string(v2(Op::kSetWill).str("k").str("").str("v")) +
                     std::string(v2(Op::kKeepAlive).i64(5000).u32(3)),
                 1);
  ASSERT_TRUE(p.error.empty()) << p.error;
  ASSERT_EQ(p.requests.size(), 2u);
  EXPECT_EQ(p.requests[0].op, Op::kSetWill);
  EXPECT_EQ(p.requests[0].keys, std::vector<std::string>{"k"});
  EXPECT_EQ(p.requests[0].values, (std::vector<std::string>{"", "v"}));
  EXPECT_EQ(p.requests[1].op, Op::kKeepAlive);
  EXPECT_EQ(p.requests[1].integer, 5000);
  EXPECT_EQ(p.requests[1].word, 3u);
  EXPECT_EQ(parse("\x40").error, "unknown opcode 0x40 in the torch-1.13 dialect");
}

TEST(FrameParserTest, AuthCarriesExactly32Bytes) {
  const std::string nonce(kAuthBytes, 'n');
  auto p = parse(torch2_hello() + std::string(v2(Op::kAuth).str(nonce)) +
                     std::string(v2(Op::kAuthProof).str(nonce)),
                 1);
  ASSERT_TRUE(p.error.empty()) << p.error;
  ASSERT_EQ(p.requests.size(), 2u);
  EXPECT_EQ(p.requests[0].op, Op::kAuth);
  EXPECT_EQ(p.requests[0].values, std::vector<std::string>{nonce});
  EXPECT_EQ(p.requests[1].op, Op::kAuthProof);
  EXPECT_EQ(parse(torch2_hello() + std::string(v2(Op::kAuth).u64(31))).error,
            "AUTH field of 31 bytes (expected 32)");
  EXPECT_EQ(parse(torch2_hello() + std::string(v2(Op::kAuthProof).u64(1ull << 40))).error,
            "AUTH_PROOF field of 1099511627776 bytes (expected 32)");
  EXPECT_EQ(parse("\x42").error, "unknown opcode 0x42 in the torch-1.13 dialect");
}

TEST(FrameParserTest, AllowOnlyFailsAtTheOpcodeByte) {
  FrameParser parser(Limits{});
  parser.allow_only({Op::kAuth, Op::kPing});
  std::string set = v1(Op::kSet).str("/k").str(std::string(1000, 'v'));
  EXPECT_EQ(parser.feed(set), 1u);  // nothing of the SET is buffered past its opcode byte
  EXPECT_TRUE(parser.failed_at_opcode());
  EXPECT_EQ(parser.error(), "SET (torch-1.13) where only AUTH is accepted");

  FrameParser allowed(Limits{});
  allowed.allow_only({Op::kAuth, Op::kPing});
  allowed.feed(torch2_hello() + std::string(v2(Op::kPing).u32(1)));
  ASSERT_TRUE(allowed.ready());
  allowed.take();
  allowed.allow_all();
  allowed.feed(v2(Op::kGetNumKeys));
  EXPECT_TRUE(allowed.ready());

  FrameParser bad_length(Limits{});
  bad_length.allow_only({Op::kAuth});
  bad_length.feed(torch2_hello() + std::string(v2(Op::kAuth).u64(7)));
  EXPECT_TRUE(bad_length.failed());
  EXPECT_FALSE(bad_length.failed_at_opcode());
}

}  // namespace
}  // namespace ddprun::store
