// RoundProtocol when rounds end: spares (asking a round with room to end, waiting for a full
// one), worker failures and the job-wide restart budget, lost connections (MemoryStore::kill:
// the last will "dead:<id>") before and after a round closes, voided rounds, and the real TCP
// path (ServerThread, AsyncClient, C10dStore). N nodes as N threads, see
// round_protocol_test_util.hpp.
#include <gtest/gtest.h>

#include "agent/rendezvous/c10d_store.hpp"
#include "agent/rendezvous/round_protocol_test_util.hpp"
#include "store/async_client.hpp"
#include "store/client.hpp"
#include "store/server.hpp"

namespace ddprun::agent::round_test {
namespace {

using store::StoreError;

awaitable<RoundChange> end_round(Node& n, int round, std::string value) {
  RoundChange won = co_await n.protocol->end_round(round, std::move(value));
  co_return won;
}

TEST_F(RoundProtocolTest, SpareAsksARoundWithRoomToEndAndEveryoneReforms) {
  auto s = settings(2, 3);
  s.last_call_timeout = 100ms;
  std::vector<Node*> members = {&node(s, "a"), &node(s, "b")};
  auto first = join_all(members);
  expect_consistent(first, 2);
  // A third node arrives while round 0 runs: it waits, having ended round 0 with "join".
  std::vector<std::future<Reform>> again;
  for (size_t i = 0; i < members.size(); ++i)
    again.push_back(reform_after_change(*members[i], first[i]));
  Node& c = node(s, "c");
  auto late = start_join(c);
  auto reformed = get_all(again);
  std::vector<FormedRound> second = {reformed[0].formed, reformed[1].formed, late.get()};
  for (const Reform& r : reformed) {
    EXPECT_EQ(r.change.kind, RoundChange::Kind::kJoin);
    EXPECT_EQ(r.change.node_id, c.desc.id);
    EXPECT_FALSE(r.change.spends_restart());
  }
  // The members re-form with it; the round closes as soon as the expected nodes are back.
  expect_consistent(second, 3);
  EXPECT_EQ(second[0].round, 1);
  EXPECT_EQ(second[0].restart_count, 0);  // scale-up spends no restart
  EXPECT_EQ(member_ids(second[0]), (std::set<std::string>{"a-id", "b-id", "c-id"}));
}

TEST_F(RoundProtocolTest, FailureSpendsOneRestartOfTheFirstNodesBudget) {
  auto s = settings(2, 2);
  s.max_restarts = 3;
  auto s_other = s;
  s_other.max_restarts = 9;  // the job keeps the budget of the node that came first
  Node& a = node(s, "a");
  Node& b = node(s_other, "b");
  auto first_a = start_join(a);
  read(b, RoundProtocol::node_key(0, 0));  // a has joined round 0 (so it read the budget)
  auto first_b = start_join(b);
  std::vector<FormedRound> first = {first_a.get(), first_b.get()};
  expect_consistent(first, 2);
  EXPECT_EQ(a.protocol->max_restarts(), 3);
  EXPECT_EQ(b.protocol->max_restarts(), 3);
  RoundChange won = b.run([](Node& n) { return end_round(n, 0, "fail:" + n.desc.id); }).get();
  RoundChange lost = a.run([](Node& n) { return end_round(n, 0, "fail:" + n.desc.id); }).get();
  EXPECT_EQ(won.kind, RoundChange::Kind::kFail);
  EXPECT_EQ(won.node_id, b.desc.id);
  EXPECT_EQ(lost.node_id, b.desc.id);  // the first event wins for everyone
  EXPECT_TRUE(won.spends_restart());
  auto second = join_all({&a, &b}, first, won);
  expect_consistent(second, 2);
  EXPECT_EQ(second[0].round, 1);
  EXPECT_EQ(second[0].restart_count, 1);
}

TEST_F(RoundProtocolTest, ALostConnectionEndsTheRoundAndTheRestReformWithoutARestart) {
  auto s = settings(2, 3);  // last call 5 s: the survivors must not wait for one
  std::vector<Node*> nodes = {&node(s, "a"), &node(s, "b"), &node(s, "c")};
  auto first = join_all(nodes);
  expect_consistent(first, 3);
  std::vector<std::future<Reform>> again;
  for (size_t i = 0; i < 2; ++i) again.push_back(reform_after_change(*nodes[i], first[i]));
  auto start = Clock::now();
  kill(*nodes[2]);  // its connection ends: the store applies its last will
  auto reformed = get_all(again);
  EXPECT_LT(Clock::now() - start, 2s);
  for (const Reform& r : reformed) {
    EXPECT_EQ(r.change.kind, RoundChange::Kind::kDead);
    EXPECT_EQ(r.change.node_id, "c-id");
  }
  std::vector<FormedRound> second = {reformed[0].formed, reformed[1].formed};
  expect_consistent(second, 2);
  EXPECT_EQ(second[0].round, 1);
  EXPECT_EQ(second[0].restart_count, 0);
  EXPECT_EQ(member_ids(second[0]), (std::set<std::string>{"a-id", "b-id"}));
}

TEST_F(RoundProtocolTest, RoundWithADeadJoinerIsVoidedAndTheRestMoveOn) {
  auto s = settings(2, 3);
  s.last_call_timeout = 100ms;
  // A ghost joined round 0 and died before it closed: its last will ended the round.
  Node& w = node(s, "w");
  w.run([](Node& n) -> awaitable<bool> {
     std::string join = RoundProtocol::key(0, "join"), change = RoundProtocol::key(0, "change");
     std::string ghost = "1 1 -1 g ghost", dead = "dead:ghost", round = "round", zero = "0";
     std::string none, node = RoundProtocol::node_key(0, 0);
     co_await n.store->add(std::move(join), 1);
     co_await n.store->set(std::move(node), std::move(ghost));
     co_await n.store->set(std::move(change), std::move(dead));
     co_await n.store->compare_set(std::move(round), std::move(none), std::move(zero));
     co_return true;
   }).get();
  auto rounds = join_all({&node(s, "a"), &node(s, "b")});
  expect_consistent(rounds, 2);
  EXPECT_EQ(rounds[0].round, 1);
  EXPECT_EQ(rounds[0].restart_count, 0);
  EXPECT_EQ(member_ids(rounds[0]), (std::set<std::string>{"a-id", "b-id"}));
  EXPECT_EQ(read(w, RoundProtocol::key(0, "closed")), R"({"n":0,"restarts":0})");  // voided
}

// New: a node dies after counting itself in round 0 (it waits in the last call), before the
// round closes. The round is voided; the others form round 1 without it, no restart spent.
TEST_F(RoundProtocolTest, NodeDyingBetweenJoinAndCloseVoidsTheRound) {
  auto s = settings(2, 4);
  s.last_call_timeout = 500ms;  // the kill below comes well before the round's last call ends
  Node& a = node(s, "a");
  Node& b = node(s, "b");
  Node& c = node(s, "c");
  std::vector<std::future<FormedRound>> joins;
  for (Node* n : {&a, &b, &c}) joins.push_back(start_join(*n));
  Node& w = node(s, "w");
  // All three counted and described (ADD join, MULTI_SET id): they wait for the last call.
  for (Node* n : {&a, &b, &c}) read(w, RoundProtocol::key(0, "id/" + n->desc.id));
  EXPECT_EQ(read(w, RoundProtocol::key(0, "join")), "3");
  EXPECT_FALSE(exists(w, RoundProtocol::key(0, "closed")));
  kill(c);
  try {
    joins[2].get();
    ADD_FAILURE() << "the killed node's join must fail";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreError::Kind::kClosed) << e.what();
  }
  std::vector<FormedRound> rounds = {joins[0].get(), joins[1].get()};
  EXPECT_EQ(read(w, RoundProtocol::key(0, "change")), "dead:c-id");
  EXPECT_EQ(read(w, RoundProtocol::key(0, "closed")), R"({"n":0,"restarts":0})");
  expect_consistent(rounds, 2);
  EXPECT_EQ(rounds[0].round, 1);
  EXPECT_EQ(rounds[0].restart_count, 0);
  EXPECT_EQ(member_ids(rounds[0]), (std::set<std::string>{"a-id", "b-id"}));
}

// New: two members of a formed round of 4 (min 2) die at once. Both survivors see the first
// death on r/0/change, re-form round 1 with the two of them, and spend no restart.
TEST_F(RoundProtocolTest, TwoSimultaneousDeathsLeaveTwoSurvivorsWhoReform) {
  auto s = settings(2, 4);
  s.last_call_timeout = 300ms;  // bounds the wait for the second dead node (see the report)
  std::vector<Node*> nodes = {&node(s, "a"), &node(s, "b"), &node(s, "c"), &node(s, "d")};
  auto first = join_all(nodes);
  expect_consistent(first, 4);
  std::vector<std::future<Reform>> again;
  for (size_t i = 0; i < 2; ++i) again.push_back(reform_after_change(*nodes[i], first[i]));
  kill(*nodes[2]);
  kill(*nodes[3]);
  auto reformed = get_all(again);
  const std::set<std::string> dead = {"c-id", "d-id"};
  for (const Reform& r : reformed) {
    EXPECT_EQ(r.change.kind, RoundChange::Kind::kDead);
    EXPECT_TRUE(dead.count(r.change.node_id)) << r.change.node_id;
    EXPECT_EQ(r.change.node_id, reformed[0].change.node_id);  // one winner, seen by both
  }
  std::vector<FormedRound> second = {reformed[0].formed, reformed[1].formed};
  expect_consistent(second, 2);
  EXPECT_EQ(second[0].round, 1);
  EXPECT_EQ(second[0].restart_count, 0);
  EXPECT_EQ(member_ids(second[0]), (std::set<std::string>{"a-id", "b-id"}));
}

// New: round 0 is full (max 2); c waits as a spare without ending it. a's worker fails and a
// leaves; c takes its place in round 1, which spends one restart.
TEST_F(RoundProtocolTest, SpareJoinsTheNextRoundAfterAFailure) {
  auto s = settings(2, 2);
  s.last_call_timeout = 300ms;  // b waits for a's id at most this long (see the report)
  Node& a = node(s, "a");
  Node& b = node(s, "b");
  auto first = join_all({&a, &b});
  expect_consistent(first, 2);
  Node& c = node(s, "c");
  auto spare = start_join(c);
  // The spare does not join a full round, nor ask it to end.
  EXPECT_EQ(spare.wait_for(200ms), std::future_status::timeout);
  EXPECT_FALSE(exists(b, RoundProtocol::key(0, "change")));
  RoundChange failed = a.run([](Node& n) { return end_round(n, 0, "fail:" + n.desc.id); }).get();
  EXPECT_EQ(failed.kind, RoundChange::Kind::kFail);
  EXPECT_EQ(failed.node_id, a.desc.id);
  auto b_next = start_join(b, first[1], failed);
  std::vector<FormedRound> second = {b_next.get(), spare.get()};
  expect_consistent(second, 2);
  EXPECT_EQ(second[0].round, 1);
  EXPECT_EQ(second[0].restart_count, 1);
  EXPECT_EQ(member_ids(second[0]), (std::set<std::string>{"b-id", "c-id"}));
  EXPECT_EQ(c.protocol->max_restarts(), 3);
}

// The real TCP path: a store server, one AsyncClient per node (C10dStore under the prefix).
// Closing one node's connection makes the server apply its will: the others see "dead:<id>".
TEST_F(RoundProtocolTest, OverTcpARoundFormsAndAClosedConnectionEndsIt) {
  store::ServerOptions o;
  o.host = "127.0.0.1";
  store::ServerThread server(o);
  const uint16_t port = server.port();
  auto s = settings(2, 3);  // the 3rd joiner closes at once; re-forming needs no last call
  std::deque<Node> nodes;
  std::vector<Node*> all;
  for (const char* addr : {"a", "b", "c"}) {
    Node& n = nodes.emplace_back(s, addr, -1);
    n.run([port](Node& n) -> awaitable<bool> {
       asio::any_io_executor ex = n.io.get_executor();
       std::string host = "127.0.0.1";
       store::ClientOptions co;
       co.connect_timeout = 5s;
       co.timeout = 5s;
       std::unique_ptr<store::AsyncClient> client =
           co_await store::AsyncClient::connect(std::move(ex), std::move(host), port, co);
       n.attach(std::make_unique<C10dStore>(std::move(client)));
       co_return true;
     }).get();
    all.push_back(&n);
  }
  auto first = join_all(all);
  expect_consistent(first, 3);
  EXPECT_EQ(first[0].round, 0);
  std::vector<std::future<Reform>> again;
  for (size_t i = 0; i < 2; ++i) again.push_back(reform_after_change(*all[i], first[i]));
  all[2]
      ->run([](Node& n) -> awaitable<bool> {
        n.store->close();
        co_return true;
      })
      .get();
  auto reformed = get_all(again);
  for (const Reform& r : reformed) {
    EXPECT_EQ(r.change.kind, RoundChange::Kind::kDead);
    EXPECT_EQ(r.change.node_id, "c-id");
  }
  std::vector<FormedRound> second = {reformed[0].formed, reformed[1].formed};
  expect_consistent(second, 2);
  EXPECT_EQ(second[0].round, 1);
  EXPECT_EQ(second[0].restart_count, 0);
  EXPECT_EQ(member_ids(second[0]), (std::set<std::string>{"a-id", "b-id"}));
}

}  // namespace
}  // namespace ddprun::agent::round_test
