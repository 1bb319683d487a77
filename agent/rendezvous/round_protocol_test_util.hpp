// Shared by round_protocol_test.cpp and round_protocol_faults_test.cpp: N nodes as N threads
// (gloo's style). A Node has its own io_context, its own store client (one shared MemoryStore,
// or a real TCP store) under the job's prefix, and its own RoundProtocol. Node::run() starts a
// coroutine on a fresh thread that runs the node's io_context for at most kBound, so a protocol
// bug fails the test (the future throws) instead of hanging it.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <deque>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "agent/rendezvous/memory_store.hpp"
#include "agent/rendezvous/prefix_store.hpp"
#include "agent/rendezvous/round_protocol.hpp"

namespace ddprun::agent::round_test {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using Keys = std::vector<std::string>;
using Clock = std::chrono::steady_clock;
template <typename T>
using awaitable = asio::awaitable<T>;

inline constexpr Millis kBound = 10s;  // one phase of one node

// Short timeouts; a long last call (5 s) so a case that must not wait for it shows it.
inline RendezvousSettings settings(int min, int max, const std::string& job = "job") {
  RendezvousSettings s;
  s.run_id = job;
  s.min_nodes = min;
  s.max_nodes = max;
  s.join_timeout = 5s;
  s.last_call_timeout = 5s;
  s.close_timeout = 2s;
  s.read_timeout = 2s;
  s.max_restarts = 3;
  return s;
}

class Node {
 public:
  Node(RendezvousSettings s, const std::string& addr, int hint) : settings(std::move(s)) {
    desc.addr = addr;
    desc.id = addr + "-id";
    desc.hint = hint;
    desc.port = 1000 + hint;
  }

  // Puts `client` under the job's prefix and creates the protocol over it.
  void attach(std::unique_ptr<RendezvousStore> client) {
    store = std::make_unique<PrefixStore>(std::move(client), "/ddprun/" + settings.run_id + "/");
    protocol = std::make_unique<RoundProtocol>(*store, settings, desc);
  }

  // Runs body(*this) (a coroutine) on this node's io_context, on a thread of its own, for at
  // most kBound. The future has its result, its exception, or "did not finish".
  template <typename F>
  auto run(F body) {
    using T = typename std::invoke_result_t<F&, Node&>::value_type;
    if (hung_) throw std::logic_error(desc.addr + " hung in an earlier phase");
    return std::async(std::launch::async, [this, body = std::move(body)]() mutable -> T {
      std::optional<T> value;
      std::exception_ptr error;
      bool done = false;
      io.restart();
      asio::co_spawn(
          io, [this, body = std::move(body)]() mutable { return body(*this); },
          [&](std::exception_ptr e, T v) {
            done = true;
            error = e;
            if (!e) value = std::move(v);
            io.stop();
          });
      io.run_for(kBound);
      if (!done) {
        hung_ = true;
        throw std::runtime_error(desc.addr + " did not finish within the test's bound");
      }
      if (error) std::rethrow_exception(error);
      return std::move(*value);
    });
  }

  asio::io_context io;  // first: destroyed last, after the clients bound to it
  RendezvousSettings settings;
  NodeDesc desc;
  std::unique_ptr<PrefixStore> store;
  std::unique_ptr<RoundProtocol> protocol;

 private:
  std::atomic<bool> hung_{false};
};

// Coroutine helpers. GCC 12: arguments are named locals, moved into the calls.
inline awaitable<std::string> read_key(Node& n, std::string key) {
  Keys keys{key};
  co_await n.store->wait(std::move(keys), Millis(0));  // bounded by the node's kBound
  std::string value = co_await n.store->get(std::move(key), Millis(1000));
  co_return value;
}

// How round `round` ended, once it has (a wait on r/R/change).
inline awaitable<RoundChange> await_change(Node& n, int round) {
  std::string value = co_await read_key(n, RoundProtocol::key(round, "change"));
  co_return RoundChange::parse(value);
}

inline std::future<FormedRound> start_join(Node& n, std::optional<FormedRound> previous = {},
                                           std::optional<RoundChange> change = {}) {
  return n.run([previous, change](Node& n) -> awaitable<FormedRound> {
    std::optional<FormedRound> p = previous;
    std::optional<RoundChange> c = change;
    FormedRound f = co_await n.protocol->join(std::move(p), std::move(c));
    co_return f;
  });
}

// What a survivor sees: the change ending its round (a wait on r/R/change), and the next
// round it joins with that change.
struct Reform {
  RoundChange change;
  FormedRound formed;
};
inline std::future<Reform> reform_after_change(Node& n, const FormedRound& previous) {
  return n.run([previous](Node& n) -> awaitable<Reform> {
    Reform r;
    r.change = co_await await_change(n, previous.round);
    std::optional<FormedRound> p = previous;
    std::optional<RoundChange> c = r.change;
    r.formed = co_await n.protocol->join(std::move(p), std::move(c));
    co_return r;
  });
}

template <typename T>
std::vector<T> get_all(std::vector<std::future<T>>& futures) {
  std::vector<T> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

// Joins `nodes` concurrently; with `previous`, node i re-joins after previous[i] ended.
inline std::vector<FormedRound> join_all(const std::vector<Node*>& nodes,
                                         const std::vector<FormedRound>& previous = {},
                                         std::optional<RoundChange> change = std::nullopt) {
  std::vector<std::future<FormedRound>> futures;
  for (size_t i = 0; i < nodes.size(); ++i) {
    futures.push_back(previous.empty() ? start_join(*nodes[i])
                                       : start_join(*nodes[i], previous[i], change));
  }
  return get_all(futures);
}

inline std::set<std::string> member_ids(const FormedRound& f) {
  std::set<std::string> ids;
  for (const NodeDesc& n : f.nodes) ids.insert(n.id);
  return ids;
}

// Every node got the same round: number, members (in join order), restart count and ranks.
inline void expect_consistent(const std::vector<FormedRound>& rounds, int n) {
  ASSERT_FALSE(rounds.empty());
  std::set<int> indices;
  for (const auto& f : rounds) {
    ASSERT_EQ(static_cast<int>(f.nodes.size()), n);
    EXPECT_EQ(f.round, rounds[0].round);
    EXPECT_EQ(f.restart_count, rounds[0].restart_count);
    for (size_t i = 0; i < f.nodes.size(); ++i) EXPECT_EQ(f.nodes[i].id, rounds[0].nodes[i].id);
    EXPECT_EQ(f.ranks.node_rank, rounds[0].ranks.node_rank);
    EXPECT_EQ(f.ranks.base_rank, rounds[0].ranks.base_rank);
    EXPECT_EQ(f.ranks.world_size, n);
    indices.insert(f.index);
  }
  EXPECT_EQ(indices.size(), rounds.size());  // each node its own join index
}

class RoundProtocolTest : public ::testing::Test {
 protected:
  // A node of job `s.run_id` with its own client of the shared MemoryStore.
  Node& node(const RendezvousSettings& s, const std::string& addr, int hint = -1) {
    Node& n = nodes_.emplace_back(s, addr, hint);
    n.attach(store_.connect(n.io.get_executor()));
    return n;
  }
  // Reads a key through `n` (waiting for it, bounded).
  static std::string read(Node& n, const std::string& key) {
    return n.run([key](Node& n) { return read_key(n, key); }).get();
  }
  static bool exists(Node& n, const std::string& key) {
    return n
        .run([key](Node& n) -> awaitable<bool> {
          Keys keys{key};
          bool present = co_await n.store->check(std::move(keys));
          co_return present;
        })
        .get();
  }
  void kill(Node& n) { ASSERT_TRUE(store_.kill(n.store->inner())); }

  MemoryStore store_;
  std::deque<Node> nodes_;
};

}  // namespace ddprun::agent::round_test
