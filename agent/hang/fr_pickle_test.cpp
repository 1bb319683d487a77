// torch's flight-recorder pickle read as the JSON form (fr_pickle.hpp): a real dump of torch
// 2.15 (gloo, one rank: an all_reduce, then a broadcast), and what the reader refuses.
#include "agent/hang/fr_pickle.hpp"

#include <gtest/gtest.h>

#include "agent/hang/collective_judge.hpp"

namespace ddprun::agent {
namespace {

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// torch._C._distributed_c10d._dump_fr_trace() after all_reduce and broadcast of 10 floats.
const std::string kDump = unhex(
    "80027d28580700000076657273696f6e71005804000000322e31307101580900000070675f636f6e66696771"
    "027d28580000000071037d2858040000006e616d657104680358040000006465736371056803580500000072"
    "616e6b73710658030000005b305d710775755810000000636f6d6d5f6c69625f76657273696f6e7108680358"
    "0900000070675f73746174757371097d28580100000030710a7d2858180000006c6173745f656e7175657565"
    "645f636f6c6c656374697665710b4b0258170000006c6173745f737461727465645f636f6c6c656374697665"
    "710c4affffffff58190000006c6173745f636f6d706c657465645f636f6c6c656374697665710d4b02757558"
    "07000000656e7472696573710e5d287d2858060000006672616d6573710f5d287d286804580a000000616c6c"
    "5f7265647563657110580800000066696c656e616d65711158620000002f726f6f742f2e63616368652f6464"
    "7072756e2f746f726368322d76656e762f6c69622f707974686f6e332e31312f736974652d7061636b616765"
    "732f746f7263682f64697374726962757465642f64697374726962757465645f633130642e70797112580400"
    "00006c696e6571134d4e10757d28680458070000007772617070657271146811585d0000002f726f6f742f2e"
    "63616368652f64647072756e2f746f726368322d76656e762f6c69622f707974686f6e332e31312f73697465"
    "2d7061636b616765732f746f7263682f64697374726962757465642f633130645f6c6f676765722e70797115"
    "68134b537571167d28680458080000003c6d6f64756c653e71176811580d0000002f746d702f66722f706b2e"
    "7079711868134b06756558090000007265636f72645f696471194b00580500000070675f6964711a4b00580d"
    "00000070726f636573735f67726f7570711b680a580a00000064656661756c745f7067711c86580b00000074"
    "68726561645f6e616d65711d5806000000707974686f6e711e58090000007468726561645f6964711f580f00"
    "000031343035373039333133323239343471205811000000636f6c6c6563746976655f7365715f696471214b"
    "01580a0000007032705f7365715f696471224b0058050000006f705f696471234b01580e00000070726f6669"
    "6c696e675f6e616d657124580f000000676c6f6f3a616c6c5f7265647563657125580f00000074696d655f63"
    "7265617465645f6e7371268a08a4f45385c3bbeb18580b000000696e7075745f73697a657371275d285d284b"
    "0a6565580c000000696e7075745f64747970657371285d285805000000466c6f6174712965580c0000006f75"
    "747075745f73697a6573712a5d285d284b0a6565580d0000006f75747075745f647479706573712b5d286829"
    "6558050000007374617465712c58090000007363686564756c6564712d581a00000074696d655f646973636f"
    "76657265645f737461727465645f6e73712e4e581c00000074696d655f646973636f76657265645f636f6d70"
    "6c657465645f6e73712f4e580700000072657469726564713088580a00000074696d656f75745f6d7371314a"
    "40771b00580600000069735f703270713289757d28680f5d287d286804580900000062726f61646361737471"
    "336811681268134dd10f7568167d28680468176811681868134b06756568194b01681a4b00681b680a681c86"
    "681d681e681f682068214b0268224b0068234b026824580e000000676c6f6f3a62726f616463617374713468"
    "268a0823c15785c3bbeb1868275d285d284b0a656568285d28682965682a5d285d284b0a6565682b5d286829"
    "65682c682d682e4e682f4e68308868314a40771b0068328975657571352e");

TEST(FrPickle, ReadsTorchsDumpAsItsJsonForm) {
  std::string error;
  auto doc = read_pickle(kDump, &error);
  ASSERT_TRUE(doc) << error;
  EXPECT_EQ((*doc)["version"], "2.10");
  EXPECT_EQ((*doc)["pg_status"]["0"]["last_enqueued_collective"], 2);
  ASSERT_TRUE((*doc)["entries"].is_array());
  EXPECT_EQ((*doc)["entries"][0]["process_group"][1], "default_pg");  // a tuple: an array
  auto trace = parse_flight_recorder_pickle(kDump, &error);
  ASSERT_TRUE(trace) << error;
  const PgTrace& pg = trace->pgs.at("0");
  EXPECT_EQ(pg.last_enqueued, 2);
  EXPECT_EQ(pg.last_completed, 2);
  ASSERT_EQ(pg.entries.size(), 2u);
  EXPECT_EQ(pg.entries[0].op, "all_reduce");
  EXPECT_EQ(pg.entries[0].bytes, 40);
  EXPECT_EQ(pg.entries[1].op, "broadcast");
  EXPECT_GT(pg.entries[1].created_ns, 1700000000LL * 1000000000LL);  // LONG1, 8 bytes
}

TEST(FrPickle, RefusesWhatItDoesNotRead) {
  std::string error;
  for (size_t cut : {size_t{0}, size_t{1}, kDump.size() / 2, kDump.size() - 1}) {
    EXPECT_FALSE(read_pickle(std::string_view(kDump).substr(0, cut), &error)) << cut;
  }
  // GLOBAL (would name a Python callable): never read.
  EXPECT_FALSE(read_pickle(std::string("\x80\x02"
                                       "cos\nsystem\n.",
                                       14),
                           &error));
  EXPECT_NE(error.find("unsupported pickle opcode 0x63"), std::string::npos) << error;
  EXPECT_FALSE(read_pickle(std::string("\x80\x02}(K\x01u.", 8), &error));  // odd SETITEMS
  EXPECT_FALSE(read_pickle(std::string("\x80\x02h\x05.", 5), &error));     // BINGET never put
  // A list that holds itself ends at the depth bound, not in a loop.
  const std::string self_holding(
      "\x80\x02]q\x00h\x00"
      "a.",
      9);
  EXPECT_FALSE(read_pickle(self_holding, &error));
  EXPECT_NE(error.find("deeper than 64"), std::string::npos) << error;
  // Small scalars: negative LONG1, BININT2, None, bools, a float.
  auto doc = read_pickle(std::string("\x80\x02](\x8a\x01\xffM\x00\x01N\x88\x89"
                                     "G?\xf0\x00\x00\x00\x00\x00\x00"
                                     "e.",
                                     24),
                         &error);
  ASSERT_TRUE(doc) << error;
  EXPECT_EQ(doc->dump(), "[-1,256,null,true,false,1.0]");
}

}  // namespace
}  // namespace ddprun::agent
