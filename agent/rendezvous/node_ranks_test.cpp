#include "agent/rendezvous/node_ranks.hpp"

#include <gtest/gtest.h>

namespace ddprun::agent {
namespace {

NodeDesc node(std::string addr, int nproc = 1, int hint = -1) {
  NodeDesc d;
  d.id = addr + ":1:abc";
  d.addr = std::move(addr);
  d.nproc = nproc;
  d.hint = hint;
  d.port = 1234;
  return d;
}

TEST(NaturalCompare, DigitRunsCompareByValue) {
  EXPECT_LT(natural_compare("node2", "node10"), 0);
  EXPECT_GT(natural_compare("node10", "node2"), 0);
  EXPECT_LT(natural_compare("10.0.0.9", "10.0.0.10"), 0);
  EXPECT_LT(natural_compare("a", "b"), 0);
  EXPECT_LT(natural_compare("node", "node1"), 0);
  EXPECT_EQ(natural_compare("host-3", "host-3"), 0);
  EXPECT_NE(natural_compare("node01", "node1"), 0);  // equal value, still a total order
  EXPECT_LT(natural_compare("rack2-node9", "rack10-node1"), 0);
}

TEST(NodeRanks, NaturalOrderOfAddressesThenJoinOrder) {
  // Joined in this order; host names sort naturally (node2 < node10), not as strings.
  std::vector<NodeDesc> nodes = {node("node10"), node("node2"), node("node1"), node("node2")};
  NodeRanks r = assign_node_ranks(nodes, false);
  EXPECT_EQ(r.node_rank, (std::vector<int>{3, 1, 0, 2}));  // the two node2 keep join order
  EXPECT_EQ(r.rank0_index, 2);
  EXPECT_EQ(r.world_size, 4);
}

TEST(NodeRanks, HintsAreHonouredFirstComeAndRanksArePrefixSums) {
  std::vector<NodeDesc> nodes = {node("b", 2), node("a", 4, 2), node("c", 1, 2), node("d", 3, 7)};
  NodeRanks r = assign_node_ranks(nodes, false);
  // "a" keeps its hint 2; "c" loses the clash and "d"'s hint is out of range: they are sorted
  // with "b" into the free ranks 0, 1, 3.
  EXPECT_EQ(r.node_rank, (std::vector<int>{0, 2, 1, 3}));
  EXPECT_EQ(r.base_rank, (std::vector<int>{0, 3, 2, 7}));  // b:2 c:1 a:4 d:3
  EXPECT_EQ(r.world_size, 10);
}

TEST(NodeRanks, StrictRanksRequireValidUniqueHints) {
  std::vector<NodeDesc> ok = {node("x", 1, 1), node("y", 1, 0)};
  EXPECT_EQ(assign_node_ranks(ok, true).node_rank, (std::vector<int>{1, 0}));
  std::vector<NodeDesc> clash = {node("x", 1, 0), node("y", 1, 0)};
  EXPECT_THROW(assign_node_ranks(clash, true), std::invalid_argument);
  std::vector<NodeDesc> out = {node("x", 1, 0), node("y", 1, 5)};
  EXPECT_THROW(assign_node_ranks(out, true), std::invalid_argument);
}

TEST(NodeRanks, DescriptorRoundTrip) {
  NodeDesc d = node("[fe80::1]", 8, 3);
  NodeDesc e = decode_node_desc(encode(d));
  EXPECT_EQ(e.id, d.id);
  EXPECT_EQ(e.addr, d.addr);
  EXPECT_EQ(e.nproc, 8);
  EXPECT_EQ(e.hint, 3);
  EXPECT_EQ(e.port, 1234);
  EXPECT_EQ(e.replica_port, 0);
  d.replica_port = 40001;
  EXPECT_EQ(decode_node_desc(encode(d)).replica_port, 40001);
  EXPECT_EQ(decode_node_desc("1 2 3 addr id").replica_port, 0);  // the optional field left out
  EXPECT_THROW(decode_node_desc("1 2 3 addr"), std::invalid_argument);     // no id
  EXPECT_THROW(decode_node_desc("x 2 3 addr id"), std::invalid_argument);  // not a number
  EXPECT_THROW(decode_node_desc("0 2 3 addr id"), std::invalid_argument);  // nproc < 1
  EXPECT_THROW(decode_node_desc("1 2 3 addr id extra"), std::invalid_argument);
  EXPECT_THROW(decode_node_desc("1 2 3 addr id 5 extra"), std::invalid_argument);
}

}  // namespace
}  // namespace ddprun::agent
