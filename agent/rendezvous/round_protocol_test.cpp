// RoundProtocol against a real store (ServerThread on a free port), N nodes as N threads
// (gloo's test style): formation, last call, spares and scale-up, restart accounting, the
// job-wide budget, closed jobs, voided rounds, timeouts, and separate job ids.
#include "agent/rendezvous/round_protocol.hpp"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "store/server.hpp"

namespace ddprun::agent {
namespace {

using namespace std::chrono_literals;

class RoundProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store::ServerOptions o;
    o.host = "127.0.0.1";
    server_ = std::make_unique<store::ServerThread>(o);
  }

  std::unique_ptr<PrefixClient> client(const std::string& job = "job") {
    store::ClientOptions o;
    o.connect_timeout = 5s;
    o.timeout = 10s;
    return std::make_unique<PrefixClient>(store::Client::connect("127.0.0.1", server_->port(), o),
                                          "/ddprun/" + job + "/");
  }

  RendezvousSettings settings(int min, int max) {
    RendezvousSettings s;
    s.run_id = "job";
    s.min_nodes = min;
    s.max_nodes = max;
    s.join_timeout = 20s;
    s.last_call_timeout = 20s;
    s.close_timeout = 5s;
    s.read_timeout = 10s;
    return s;
  }

  // One simulated node: its own connection and protocol object.
  struct Node {
    std::unique_ptr<PrefixClient> client;
    std::unique_ptr<RoundProtocol> protocol;
    NodeDesc desc;
  };
  Node node(const RendezvousSettings& s, const std::string& addr, int hint = -1,
            const std::string& job = "job") {
    Node n;
    n.client = client(job);
    n.desc.addr = addr;
    n.desc.id = addr + ":" + std::to_string(next_id_++);
    n.desc.hint = hint;
    n.desc.port = 1000 + next_id_;
    n.protocol = std::make_unique<RoundProtocol>(*n.client, s, n.desc);
    return n;
  }

  // Joins `nodes` concurrently (first join); returns their formed rounds.
  static std::vector<FormedRound> join_all(std::vector<Node>& nodes) {
    std::vector<std::future<FormedRound>> futures;
    for (auto& n : nodes) {
      futures.push_back(
          std::async(std::launch::async, [&n] { return n.protocol->join(nullptr, {}); }));
    }
    std::vector<FormedRound> out;
    for (auto& f : futures) out.push_back(f.get());
    return out;
  }

  static void expect_consistent(const std::vector<FormedRound>& rounds, int n) {
    for (const auto& f : rounds) {
      ASSERT_EQ(static_cast<int>(f.nodes.size()), n);
      EXPECT_EQ(f.round, rounds[0].round);
      EXPECT_EQ(f.restart_count, rounds[0].restart_count);
      EXPECT_EQ(f.ranks.node_rank, rounds[0].ranks.node_rank);
      EXPECT_EQ(f.ranks.base_rank, rounds[0].ranks.base_rank);
    }
  }

  std::unique_ptr<store::ServerThread> server_;
  int next_id_ = 0;
};

TEST_F(RoundProtocolTest, MaxNodesCloseAtOnceWithConsistentRanks) {
  auto s = settings(2, 4);  // last call 20 s: only the 4th joiner can close it quickly
  std::vector<Node> nodes;
  for (const char* a : {"node10", "node2", "node1", "node3"}) nodes.push_back(node(s, a));
  auto start = std::chrono::steady_clock::now();
  auto rounds = join_all(nodes);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  expect_consistent(rounds, 4);
  EXPECT_EQ(rounds[0].round, 0);
  EXPECT_EQ(rounds[0].restart_count, 0);
  std::set<int> indices;
  for (const auto& f : rounds) indices.insert(f.index);
  EXPECT_EQ(indices, (std::set<int>{0, 1, 2, 3}));
  // Natural order of addresses: node1, node2, node3, node10.
  for (const auto& f : rounds) {
    for (size_t i = 0; i < f.nodes.size(); ++i) {
      std::map<std::string, int> want = {{"node1", 0}, {"node2", 1}, {"node3", 2}, {"node10", 3}};
      EXPECT_EQ(f.ranks.node_rank[i], want[f.nodes[i].addr]);
    }
  }
}

TEST_F(RoundProtocolTest, MinNodesCloseAfterLastCall) {
  auto s = settings(2, 8);
  s.last_call_timeout = 200ms;
  std::vector<Node> nodes;
  nodes.push_back(node(s, "a"));
  nodes.push_back(node(s, "b"));
  auto rounds = join_all(nodes);
  expect_consistent(rounds, 2);
}

TEST_F(RoundProtocolTest, TooFewNodesTimeOutWithAClearMessage) {
  auto s = settings(3, 3);
  s.join_timeout = 300ms;
  Node a = node(s, "a");
  try {
    a.protocol->join(nullptr, {});
    FAIL() << "expected a timeout";
  } catch (const RendezvousFailed& e) {
    EXPECT_NE(std::string(e.what()).find("join_timeout"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("only 1 joined"), std::string::npos) << e.what();
  }
}

TEST_F(RoundProtocolTest, SpareAsksARoundWithRoomToEndAndEveryoneReforms) {
  auto s = settings(2, 3);
  s.last_call_timeout = 100ms;
  std::vector<Node> nodes;
  nodes.push_back(node(s, "a"));
  nodes.push_back(node(s, "b"));
  auto first = join_all(nodes);
  expect_consistent(first, 2);
  // A third node arrives while round 0 runs: it waits, having ended round 0 with "join".
  Node c = node(s, "c");
  auto late = std::async(std::launch::async, [&] { return c.protocol->join(nullptr, {}); });
  auto watcher = client();
  watcher->wait({RoundProtocol::key(0, "change")}, 10s);
  RoundChange change = RoundChange::parse(watcher->get(RoundProtocol::key(0, "change"), 10s));
  EXPECT_EQ(change.kind, RoundChange::Kind::kJoin);
  EXPECT_EQ(change.node_id, c.desc.id);
  EXPECT_FALSE(change.spends_restart());
  // The members re-form with it; the round closes as soon as the expected nodes are back.
  std::vector<std::future<FormedRound>> again;
  for (size_t i = 0; i < nodes.size(); ++i) {
    again.push_back(std::async(std::launch::async,
                               [&, i] { return nodes[i].protocol->join(&first[i], change); }));
  }
  std::vector<FormedRound> second = {again[0].get(), again[1].get(), late.get()};
  expect_consistent(second, 3);
  EXPECT_EQ(second[0].round, 1);
  EXPECT_EQ(second[0].restart_count, 0);  // scale-up spends no restart
}

TEST_F(RoundProtocolTest, FailureSpendsOneRestartOfTheFirstNodesBudget) {
  auto s = settings(2, 2);
  s.max_restarts = 3;
  auto s_other = s;
  s_other.max_restarts = 9;  // the job keeps the budget of the node that came first
  std::vector<Node> nodes;
  nodes.push_back(node(s, "a"));
  auto first_a =
      std::async(std::launch::async, [&] { return nodes[0].protocol->join(nullptr, {}); });
  {
    auto w = client();
    w->wait({RoundProtocol::node_key(0, 0)}, 10s);
  }
  nodes.push_back(node(s_other, "b"));
  FormedRound first_b = nodes[1].protocol->join(nullptr, {});
  std::vector<FormedRound> first = {first_a.get(), first_b};
  EXPECT_EQ(nodes[0].protocol->max_restarts(), 3);
  EXPECT_EQ(nodes[1].protocol->max_restarts(), 3);
  RoundChange won = nodes[1].protocol->end_round(0, "fail:" + nodes[1].desc.id);
  RoundChange lost = nodes[0].protocol->end_round(0, "fail:" + nodes[0].desc.id);
  EXPECT_EQ(lost.node_id, nodes[1].desc.id);  // the first event wins for everyone
  EXPECT_TRUE(won.spends_restart());
  std::vector<std::future<FormedRound>> again;
  for (size_t i = 0; i < 2; ++i) {
    again.push_back(
        std::async(std::launch::async, [&, i] { return nodes[i].protocol->join(&first[i], won); }));
  }
  std::vector<FormedRound> second = {again[0].get(), again[1].get()};
  expect_consistent(second, 2);
  EXPECT_EQ(second[0].restart_count, 1);
}

TEST_F(RoundProtocolTest, ALostConnectionEndsTheRoundAndTheRestReformWithoutARestart) {
  auto s = settings(2, 3);
  s.last_call_timeout = 20s;  // the survivors must not wait for a last call
  std::vector<Node> nodes;
  for (const char* a : {"a", "b", "c"}) nodes.push_back(node(s, a));
  auto first = join_all(nodes);
  expect_consistent(first, 3);
  const std::string dead_id = nodes[2].desc.id;
  nodes[2].protocol.reset();
  nodes[2].client.reset();  // the connection closes: the store applies its last will
  auto w = client();
  w->wait({RoundProtocol::key(0, "change")}, 10s);
  RoundChange change = RoundChange::parse(w->get(RoundProtocol::key(0, "change"), 10s));
  EXPECT_EQ(change.kind, RoundChange::Kind::kDead);
  EXPECT_EQ(change.node_id, dead_id);
  auto start = std::chrono::steady_clock::now();
  std::vector<std::future<FormedRound>> again;
  for (size_t i = 0; i < 2; ++i) {
    again.push_back(std::async(std::launch::async,
                               [&, i] { return nodes[i].protocol->join(&first[i], change); }));
  }
  std::vector<FormedRound> second = {again[0].get(), again[1].get()};
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  expect_consistent(second, 2);
  EXPECT_EQ(second[0].round, 1);
  EXPECT_EQ(second[0].restart_count, 0);
}

TEST_F(RoundProtocolTest, FinishedJobClosesTheRendezvous) {
  auto s = settings(2, 2);
  std::vector<Node> nodes;
  nodes.push_back(node(s, "a"));
  nodes.push_back(node(s, "b"));
  auto rounds = join_all(nodes);
  EXPECT_FALSE(nodes[0].protocol->report_success(rounds[0]));
  EXPECT_TRUE(nodes[1].protocol->report_success(rounds[1]));
  auto w = client();
  EXPECT_EQ(w->get(RoundProtocol::key(0, "change"), 1s), "done");
  Node late = node(s, "c");
  try {
    late.protocol->join(nullptr, {});
    FAIL() << "a late node must not join a finished job";
  } catch (const JobClosed& e) {
    EXPECT_TRUE(e.succeeded());
    EXPECT_NE(std::string(e.what()).find("already finished"), std::string::npos) << e.what();
  }
}

TEST_F(RoundProtocolTest, RoundWithADeadJoinerIsVoidedAndTheRestMoveOn) {
  auto s = settings(2, 3);
  s.last_call_timeout = 100ms;
  // A ghost joined round 0 and died before it closed: its last will ended the round.
  auto w = client();
  w->add(RoundProtocol::key(0, "join"), 1);
  w->set(RoundProtocol::node_key(0, 0), "1 1 -1 g ghost");
  w->set(RoundProtocol::key(0, "change"), "dead:ghost");
  w->compare_set("round", "", "0");
  std::vector<Node> nodes;
  nodes.push_back(node(s, "a"));
  nodes.push_back(node(s, "b"));
  auto rounds = join_all(nodes);
  expect_consistent(rounds, 2);
  EXPECT_EQ(rounds[0].round, 1);
  for (const auto& n : rounds[0].nodes) EXPECT_NE(n.id, "ghost");
}

TEST_F(RoundProtocolTest, JobsWithDifferentIdsDoNotInterfere) {
  auto s1 = settings(2, 2);
  auto s2 = settings(2, 2);
  s2.run_id = "other";
  std::vector<Node> job1, job2;
  job1.push_back(node(s1, "a"));
  job1.push_back(node(s1, "b"));
  job2.push_back(node(s2, "c", -1, "other"));
  job2.push_back(node(s2, "d", -1, "other"));
  auto f1 = std::async(std::launch::async, [&] { return join_all(job1); });
  auto r2 = join_all(job2);
  auto r1 = f1.get();
  expect_consistent(r1, 2);
  expect_consistent(r2, 2);
  for (const auto& n : r1[0].nodes) EXPECT_TRUE(n.addr == "a" || n.addr == "b");
  for (const auto& n : r2[0].nodes) EXPECT_TRUE(n.addr == "c" || n.addr == "d");
}

TEST_F(RoundProtocolTest, StaticRanksFollowNodeRankAndRejectClashes) {
  auto s = settings(2, 2);
  s.static_ranks = true;
  std::vector<Node> nodes;
  nodes.push_back(node(s, "zz", 0));
  nodes.push_back(node(s, "aa", 1));
  auto rounds = join_all(nodes);
  for (const auto& f : rounds) {
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(f.ranks.node_rank[i], f.nodes[i].hint);
    }
  }
  auto s2 = s;
  s2.run_id = "clash";
  std::vector<Node> clash;
  clash.push_back(node(s2, "x", 1, "clash"));
  clash.push_back(node(s2, "y", 1, "clash"));
  std::vector<std::future<FormedRound>> f;
  for (auto& n : clash) {
    f.push_back(std::async(std::launch::async, [&n] { return n.protocol->join(nullptr, {}); }));
  }
  for (auto& x : f) EXPECT_THROW(x.get(), RendezvousFailed);
}

}  // namespace
}  // namespace ddprun::agent
