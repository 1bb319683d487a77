// RoundProtocol, N nodes as N threads over one MemoryStore (round_protocol_test_util.hpp):
// formation at max nodes, the last call, the join timeout, closed jobs, separate job ids and
// static ranks. Faults (spares, failures, deaths, voided rounds, the TCP path) are in
// round_protocol_faults_test.cpp.
#include "agent/rendezvous/round_protocol.hpp"

#include <gtest/gtest.h>

#include <map>

#include "agent/rendezvous/round_protocol_test_util.hpp"

namespace ddprun::agent::round_test {
namespace {

TEST_F(RoundProtocolTest, MaxNodesCloseAtOnceWithConsistentRanks) {
  auto s = settings(2, 4);  // last call 5 s: only the 4th joiner closes it quickly
  std::vector<Node*> nodes;
  for (const char* a : {"node10", "node2", "node1", "node3"}) nodes.push_back(&node(s, a));
  auto start = Clock::now();
  auto rounds = join_all(nodes);
  EXPECT_LT(Clock::now() - start, 2s);
  expect_consistent(rounds, 4);
  EXPECT_EQ(rounds[0].round, 0);
  EXPECT_EQ(rounds[0].restart_count, 0);
  for (size_t i = 0; i < rounds.size(); ++i) {
    EXPECT_EQ(rounds[i].nodes[rounds[i].index].id, nodes[i]->desc.id);  // its own index
  }
  // Natural order of addresses: node1, node2, node3, node10.
  std::map<std::string, int> want = {{"node1", 0}, {"node2", 1}, {"node3", 2}, {"node10", 3}};
  for (const auto& f : rounds) {
    for (size_t i = 0; i < f.nodes.size(); ++i) {
      EXPECT_EQ(f.ranks.node_rank[i], want[f.nodes[i].addr]) << f.nodes[i].addr;
      EXPECT_EQ(f.ranks.base_rank[i], want[f.nodes[i].addr]);  // one process per node
    }
  }
}

TEST_F(RoundProtocolTest, MinNodesCloseAfterLastCall) {
  auto s = settings(2, 8);
  s.last_call_timeout = 200ms;
  std::vector<Node*> nodes = {&node(s, "a"), &node(s, "b")};
  auto start = Clock::now();
  auto rounds = join_all(nodes);
  auto took = Clock::now() - start;
  expect_consistent(rounds, 2);
  EXPECT_EQ(rounds[0].round, 0);
  EXPECT_GE(took, 190ms);  // min nodes are there, but the round waits out its last call
  EXPECT_LT(took, 2s);
}

TEST_F(RoundProtocolTest, TooFewNodesTimeOutWithAClearMessage) {
  auto s = settings(3, 3);
  s.join_timeout = 300ms;
  auto joined = start_join(node(s, "a"));
  try {
    joined.get();
    FAIL() << "expected a timeout";
  } catch (const RendezvousFailed& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("join_timeout"), std::string::npos) << what;
    EXPECT_NE(what.find("3 node(s) of job 'job'"), std::string::npos) << what;
    EXPECT_NE(what.find("only 1 joined round 0"), std::string::npos) << what;
  }
}

TEST_F(RoundProtocolTest, FinishedJobClosesTheRendezvous) {
  auto s = settings(2, 2);
  Node& a = node(s, "a");
  Node& b = node(s, "b");
  auto rounds = join_all({&a, &b});
  expect_consistent(rounds, 2);
  auto success = [](const FormedRound& f) {
    return [f](Node& n) -> awaitable<bool> {
      FormedRound mine = f;
      bool last = co_await n.protocol->report_success(std::move(mine));
      co_return last;
    };
  };
  EXPECT_FALSE(a.run(success(rounds[0])).get());
  EXPECT_TRUE(b.run(success(rounds[1])).get());  // the last one ends the round and the job
  EXPECT_EQ(read(a, RoundProtocol::key(0, "change")), "done");
  EXPECT_EQ(read(a, "closed"), "done");
  auto late = start_join(node(s, "c"));
  try {
    late.get();
    FAIL() << "a late node must not join a finished job";
  } catch (const JobClosed& e) {
    EXPECT_TRUE(e.succeeded());
    EXPECT_NE(std::string(e.what()).find("already finished"), std::string::npos) << e.what();
  }
}

TEST_F(RoundProtocolTest, JobsWithDifferentIdsDoNotInterfere) {
  auto s1 = settings(2, 2);
  auto s2 = settings(2, 2, "other");
  s2.max_restarts = 7;
  // All four at once on one store: without the prefixes they would make one round of 2 and a
  // spare, or two rounds mixing the jobs.
  std::vector<Node*> job1 = {&node(s1, "a"), &node(s1, "b")};
  std::vector<Node*> job2 = {&node(s2, "c"), &node(s2, "d")};
  std::vector<std::future<FormedRound>> f1, f2;
  for (Node* n : job1) f1.push_back(start_join(*n));
  for (Node* n : job2) f2.push_back(start_join(*n));
  auto r1 = get_all(f1);
  auto r2 = get_all(f2);
  expect_consistent(r1, 2);
  expect_consistent(r2, 2);
  EXPECT_EQ(r1[0].round, 0);
  EXPECT_EQ(r2[0].round, 0);
  EXPECT_EQ(member_ids(r1[0]), (std::set<std::string>{"a-id", "b-id"}));
  EXPECT_EQ(member_ids(r2[0]), (std::set<std::string>{"c-id", "d-id"}));
  EXPECT_EQ(job1[0]->protocol->max_restarts(), 3);  // each job its own budget
  EXPECT_EQ(job2[0]->protocol->max_restarts(), 7);
}

TEST_F(RoundProtocolTest, StaticRanksFollowNodeRankAndRejectClashes) {
  auto s = settings(2, 2);
  s.static_ranks = true;
  auto rounds = join_all({&node(s, "zz", 0), &node(s, "aa", 1)});
  expect_consistent(rounds, 2);
  for (const auto& f : rounds) {
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(f.ranks.node_rank[i], f.nodes[i].hint) << f.nodes[i].addr;  // not by address
    }
  }
  auto s2 = settings(2, 2, "clash");
  s2.static_ranks = true;
  std::vector<std::future<FormedRound>> clash;
  clash.push_back(start_join(node(s2, "x", 1)));
  clash.push_back(start_join(node(s2, "y", 1)));
  for (auto& f : clash) {
    try {
      f.get();
      ADD_FAILURE() << "two nodes with --node-rank 1 must not form a static round";
    } catch (const RendezvousFailed& e) {
      EXPECT_NE(std::string(e.what()).find("cannot assign node ranks"), std::string::npos)
          << e.what();
    }
  }
}

TEST(RoundChangeTest, AHangIsAFailureThatSaysSo) {
  RoundChange hang = RoundChange::parse("hang:node-7");
  EXPECT_EQ(hang.kind, RoundChange::Kind::kFail);
  EXPECT_TRUE(hang.hang);
  EXPECT_EQ(hang.node_id, "node-7");
  EXPECT_TRUE(hang.spends_restart());
  RoundChange fail = RoundChange::parse("fail:node-7");
  EXPECT_EQ(fail.kind, RoundChange::Kind::kFail);
  EXPECT_FALSE(fail.hang);
  EXPECT_THROW(RoundChange::parse("hung:node-7"), RendezvousFailed);
}

}  // namespace
}  // namespace ddprun::agent::round_test
