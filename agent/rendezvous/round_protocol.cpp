#include "agent/rendezvous/round_protocol.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include "store/sys/time_text.hpp"

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;
using store::StoreError;

int to_int(const std::string& text, const char* what) {
  try {
    size_t used = 0;
    int v = std::stoi(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw RendezvousFailed(std::string("corrupt rendezvous state: ") + what + " is '" +
                         text.substr(0, 100) + "'");
}

bool is_timeout(const StoreError& e) {
  return e.kind() == StoreError::Kind::kTimeout;
}

}  // namespace

RoundChange RoundChange::parse(const std::string& value) {
  RoundChange c;
  auto take = [&](const char* prefix, Kind kind) {
    std::string_view p(prefix);
    if (value.compare(0, p.size(), p) != 0) return false;
    c.kind = kind;
    c.node_id = value.substr(p.size());
    return true;
  };
  if (value == "done") return c;
  if (take("join:", Kind::kJoin) || take("dead:", Kind::kDead) || take("fail:", Kind::kFail)) {
    return c;
  }
  throw RendezvousFailed("corrupt rendezvous state: a round ended with '" + value.substr(0, 100) +
                         "'");
}

RoundProtocol::RoundProtocol(PrefixClient& client, const RendezvousSettings& settings,
                             NodeDesc self)
    : client_(client), s_(settings), self_(std::move(self)), self_text_(encode(self_)) {}

void RoundProtocol::set_self(NodeDesc self) {
  self_ = std::move(self);
  self_text_ = encode(self_);
}

std::string RoundProtocol::key(int round, const std::string& name) {
  return "r/" + std::to_string(round) + "/" + name;
}

std::string RoundProtocol::node_key(int round, int index) {
  return key(round, "node/" + std::to_string(index));
}

void RoundProtocol::check_job_open() {
  if (!client_.check({"closed"})) return;
  std::string why = client_.get("closed", s_.read_timeout);
  if (why == "done") {
    throw JobClosed("job '" + s_.run_id +
                        "' has already finished: its rendezvous is closed (a new job needs a "
                        "new --rdzv-id)",
                    true);
  }
  throw JobClosed("job '" + s_.run_id + "' is over (" + why +
                      "): its rendezvous is closed (a new job needs a new --rdzv-id)",
                  false);
}

FormedRound RoundProtocol::join(const FormedRound* previous,
                                const std::optional<RoundChange>& change) {
  join_deadline_ = Clock::now() + s_.join_timeout;
  check_job_open();
  int r;
  std::vector<std::string> expected;  // ids of the nodes expected back in round r
  if (previous) {
    r = previous->round + 1;
    client_.compare_set("round", std::to_string(previous->round), std::to_string(r));
    last_end_ = LastEnd{previous->round, previous->restart_count, change.value_or(RoundChange{})};
    for (const NodeDesc& n : previous->nodes) {
      if (change && change->kind == RoundChange::Kind::kDead && n.id == change->node_id) continue;
      expected.push_back(n.id);
    }
    if (change && change->kind == RoundChange::Kind::kJoin) expected.push_back(change->node_id);
  } else {
    max_restarts_ = to_int(client_.compare_set("max_restarts", "", std::to_string(s_.max_restarts)),
                           "max_restarts");
    r = to_int(client_.compare_set("round", "", "0"), "round");
  }
  for (;;) {
    Closed closed;
    if (auto formed = try_round(r, expected, &closed)) return *formed;
    // Not a member of round r (it runs without us, or it broke before it started): wait
    // until it ends, then join the next one.
    // A round with room takes this node at once (it restarts without spending a restart),
    // unless one of its nodes has already finished: then the job is about to end.
    if (closed.n > 0 && closed.n < s_.max_nodes && client_.add(key(r, "ok"), 0) == 0) {
      client_.compare_set(key(r, "change"), "", "join:" + self_.id);
    }
    client_.wait({key(r, "change")}, Millis(0));  // no deadline: until the running round ends
    RoundChange c = RoundChange::parse(client_.get(key(r, "change"), s_.read_timeout));
    check_job_open();
    if (c.kind == RoundChange::Kind::kDone) {
      throw JobClosed("job '" + s_.run_id + "' finished while this node waited to join", true);
    }
    if (c.spends_restart() && closed.restarts >= max_restarts_) {
      throw JobClosed(
          "job '" + s_.run_id + "' failed (no restarts left) while this node waited to join",
          false);
    }
    last_end_ = LastEnd{r, closed.restarts, c};
    client_.compare_set("round", std::to_string(r), std::to_string(r + 1));
    ++r;
    expected.clear();
  }
}

std::optional<FormedRound> RoundProtocol::try_round(int r, const std::vector<std::string>& expected,
                                                    Closed* closed) {
  *closed = Closed{};
  if (client_.check({key(r, "closed")})) {
    *closed = read_closed(r, s_.read_timeout);  // running: wait as a spare
    return std::nullopt;
  }
  // The will first: once counted, this node's death must end the round.
  client_.set_will(key(r, "change"), "", "dead:" + self_.id);
  const int index = static_cast<int>(client_.add(key(r, "join"), 1)) - 1;
  client_.multi_set({{node_key(r, index), self_text_}, {key(r, "id/" + self_.id), "1"}});
  Closed c;
  if (index >= s_.max_nodes) {
    c = read_closed(r, s_.close_timeout);  // the max-th joiner closes it at once
  } else if (index == s_.max_nodes - 1) {
    c = close_round(r);
  } else if (client_.check({key(r, "closed")})) {
    c = read_closed(r, s_.read_timeout);
  } else {
    if (index < s_.min_nodes - 1) {
      auto left = std::chrono::duration_cast<Millis>(join_deadline_ - Clock::now());
      if (left.count() <= 0) min_not_reached(r);
      try {
        client_.wait({node_key(r, s_.min_nodes - 1)}, left);
      } catch (const StoreError& e) {
        if (!is_timeout(e)) throw;
        min_not_reached(r);
      }
    }
    if (!expected.empty()) {
      // Re-forming after a round ended: close as soon as its surviving members (and the
      // node that asked to join) are back; last_call_timeout bounds the wait for them.
      std::vector<std::string> ids;
      for (const auto& id : expected) ids.push_back(key(r, "id/" + id));
      try {
        client_.wait(ids, s_.last_call_timeout);
      } catch (const StoreError& e) {
        if (!is_timeout(e)) throw;
      }
      c = close_round(r);
    } else {
      // First formation (torchrun's rule): min nodes are here; wait last_call_timeout for
      // more unless max arrive (the max-th closes) or another node closes first.
      try {
        client_.wait({key(r, "closed")}, s_.last_call_timeout);
        c = read_closed(r, s_.read_timeout);
      } catch (const StoreError& e) {
        if (!is_timeout(e)) throw;
        c = close_round(r);
      }
    }
  }
  *closed = c;
  if (index >= c.n) {              // a spare, or the round was voided
    client_.set_will("", "", "");  // a spare's death must not end the running round
    return std::nullopt;
  }
  // The closer gathers the members' descriptors into one key, once: every member then reads
  // one value instead of N (N x N reads would dominate large rounds).
  std::string members;
  try {
    if (c.won) {
      std::vector<std::string> keys;
      keys.reserve(c.n);
      for (int i = 0; i < c.n; ++i) keys.push_back(node_key(r, i));
      std::string all;
      for (const auto& v : client_.multi_get(keys, s_.close_timeout)) all += v + "\n";
      client_.set(key(r, "members"), all);
      members = std::move(all);
    } else {
      members = client_.get(key(r, "members"), s_.close_timeout);
    }
  } catch (const StoreError& e) {
    // A member counted itself and died before describing itself, or the closer died before
    // writing the members (a will ended the round): this round cannot start; wait for its
    // end like a spare.
    if (!is_timeout(e) || !client_.check({key(r, "change")})) throw;
    client_.set_will("", "", "");
    closed->n = 0;
    return std::nullopt;
  }
  FormedRound f;
  f.round = r;
  f.index = index;
  f.restart_count = c.restarts;
  std::string_view rest = members;
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    try {
      f.nodes.push_back(decode_node_desc(rest.substr(0, nl)));
    } catch (const std::invalid_argument& e) {
      throw RendezvousFailed(std::string("corrupt rendezvous state: ") + e.what());
    }
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
  }
  if (static_cast<int>(f.nodes.size()) != c.n) {
    throw RendezvousFailed("corrupt rendezvous state: round " + std::to_string(r) + " lists " +
                           std::to_string(f.nodes.size()) + " members, not " + std::to_string(c.n));
  }
  try {
    f.ranks = assign_node_ranks(f.nodes, s_.static_ranks);
  } catch (const std::invalid_argument& e) {
    throw RendezvousFailed(std::string("cannot assign node ranks: ") + e.what());
  }
  return f;
}

int RoundProtocol::restarts_for(int r) {
  if (r == 0) return 0;
  if (!last_end_ || last_end_->round != r - 1) {
    // A newcomer closing a later round: read how the previous one ended.
    Closed prev = read_closed(r - 1, s_.read_timeout);
    RoundChange c = RoundChange::parse(client_.get(key(r - 1, "change"), s_.read_timeout));
    last_end_ = LastEnd{r - 1, prev.restarts, c};
  }
  return last_end_->restarts + (last_end_->change.spends_restart() ? 1 : 0);
}

RoundProtocol::Closed RoundProtocol::close_round(int r) {
  int joined = static_cast<int>(client_.add(key(r, "join"), 0));
  int n = std::min(joined, s_.max_nodes);
  // A joiner died before the round closed (its will ended it): void the round (n = 0) so its
  // joiners move on together instead of starting workers with a dead member.
  if (client_.check({key(r, "change")})) n = 0;
  nlohmann::json j = {{"n", n}, {"restarts", restarts_for(r)}};
  const std::string mine = j.dump();
  const std::string stored = client_.compare_set(key(r, "closed"), "", mine);
  Closed c = parse_closed(stored);
  // Nodes that proposed the same record all write the same members list: harmless.
  c.won = stored == mine;
  return c;
}

RoundProtocol::Closed RoundProtocol::read_closed(int r, Millis timeout) {
  return parse_closed(client_.get(key(r, "closed"), timeout));
}

RoundProtocol::Closed RoundProtocol::parse_closed(const std::string& text) {
  try {
    auto j = nlohmann::json::parse(text);
    Closed c{j.at("n").get<int>(), j.at("restarts").get<int>()};
    if (c.n < 0 || c.restarts < 0) throw std::invalid_argument("out of range");
    return c;
  } catch (const std::exception& e) {
    throw RendezvousFailed("corrupt rendezvous state: round record '" + text.substr(0, 100) + "'");
  }
}

void RoundProtocol::min_not_reached(int r) {
  int joined = static_cast<int>(client_.add(key(r, "join"), 0));
  throw RendezvousFailed("timed out after " + sys::seconds_text(s_.join_timeout) +
                         " (join_timeout) waiting for " + std::to_string(s_.min_nodes) +
                         " node(s) of job '" + s_.run_id + "': only " + std::to_string(joined) +
                         " joined round " + std::to_string(r));
}

RoundChange RoundProtocol::end_round(int round, const std::string& value) {
  return RoundChange::parse(client_.compare_set(key(round, "change"), "", value));
}

bool RoundProtocol::report_success(const FormedRound& f) {
  int64_t ok = client_.add(key(f.round, "ok"), 1);
  if (ok != static_cast<int64_t>(f.nodes.size())) return false;
  // Every node's workers exited 0: the job is done, whatever else happens now.
  close_job("done");
  client_.compare_set(key(f.round, "change"), "", "done");
  return true;
}

void RoundProtocol::close_job(const std::string& why) {
  client_.compare_set("closed", "", why);
}

void RoundProtocol::say_bye(const FormedRound& f) {
  client_.set(key(f.round, "bye/" + self_.id), "1");
}

void RoundProtocol::wait_byes(const FormedRound& f, Millis timeout) {
  std::vector<std::string> keys;
  for (const NodeDesc& n : f.nodes) {
    if (n.id != self_.id) keys.push_back(key(f.round, "bye/" + n.id));
  }
  if (keys.empty()) return;
  try {
    client_.wait(keys, timeout);
  } catch (const StoreError& e) {
    if (!is_timeout(e)) throw;
  }
}

}  // namespace ddprun::agent
