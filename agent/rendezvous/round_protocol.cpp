// Coroutine note: GCC 12 rejects a string literal converted to std::string inside a nested
// call or a braced list within a co_await expression ("array used as initializer"), so such
// arguments are built as named locals first (key() takes a string_view for the same reason).
#include "agent/rendezvous/round_protocol.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "agent/rendezvous/rendezvous.hpp"
#include "store/client.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;
using store::StoreError;
using Keys = std::vector<std::string>;

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
  if (take("hang:", Kind::kFail)) {
    c.hang = true;
    return c;
  }
  throw RendezvousFailed("corrupt rendezvous state: a round ended with '" + value.substr(0, 100) +
                         "'");
}

RoundProtocol::RoundProtocol(RendezvousStore& store, const RendezvousSettings& settings,
                             NodeDesc self)
    : store_(store), s_(settings), self_(std::move(self)), self_text_(encode(self_)) {}

void RoundProtocol::set_self(NodeDesc self) {
  self_ = std::move(self);
  self_text_ = encode(self_);
}

std::string RoundProtocol::key(int round, std::string_view name) {
  std::string k = "r/" + std::to_string(round) + "/";
  k += name;
  return k;
}

std::string RoundProtocol::node_key(int round, int index) {
  return key(round, "node/" + std::to_string(index));
}

RoundProtocol::awaitable<void> RoundProtocol::check_job_open() {
  Keys closed{"closed"};
  if (!co_await store_.check(std::move(closed))) co_return;
  std::string why = co_await store_.get("closed", s_.read_timeout);
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

RoundProtocol::awaitable<int> RoundProtocol::first_round() {
  std::string budget = std::to_string(s_.max_restarts);
  max_restarts_ =
      to_int(co_await store_.compare_set("max_restarts", "", std::move(budget)), "max_restarts");
  co_return to_int(co_await store_.compare_set("round", "", "0"), "round");
}

RoundProtocol::awaitable<FormedRound> RoundProtocol::join(std::optional<FormedRound> previous,
                                                          std::optional<RoundChange> change) {
  join_deadline_ = Clock::now() + s_.join_timeout;
  co_await check_job_open();
  int r;
  Keys expected;  // ids of the nodes expected back in round r
  if (previous) {
    r = previous->round + 1;
    std::string was = std::to_string(previous->round), now = std::to_string(r);
    co_await store_.compare_set("round", std::move(was), std::move(now));
    last_end_ = LastEnd{previous->round, previous->restart_count, change.value_or(RoundChange{})};
    for (const NodeDesc& n : previous->nodes) {
      if (change && change->kind == RoundChange::Kind::kDead && n.id == change->node_id) continue;
      expected.push_back(n.id);
    }
    if (change && change->kind == RoundChange::Kind::kJoin) expected.push_back(change->node_id);
  } else {
    r = co_await first_round();
  }
  for (;;) {
    Attempt a = co_await try_round(r, std::move(expected));
    if (a.formed) co_return std::move(*a.formed);
    // Not a member of round r (it runs without us, or it broke before it started): wait
    // until it ends, then join the next one.
    co_await wait_as_spare(r, a.closed);
    ++r;
    expected.clear();
  }
}

RoundProtocol::awaitable<void> RoundProtocol::wait_as_spare(int r, const Closed& closed) {
  // A round with room takes this node at once (it restarts without spending a restart),
  // unless one of its nodes has already finished: then the job is about to end.
  if (closed.n > 0 && closed.n < s_.max_nodes && co_await store_.add(key(r, "ok"), 0) == 0) {
    std::string ask = "join:" + self_.id;
    co_await store_.compare_set(key(r, "change"), "", std::move(ask));
  }
  Keys change_key{key(r, "change")};
  co_await store_.wait(std::move(change_key), Millis(0));  // until the running round ends
  RoundChange c = RoundChange::parse(co_await store_.get(key(r, "change"), s_.read_timeout));
  co_await check_job_open();
  if (c.kind == RoundChange::Kind::kDone) {
    throw JobClosed("job '" + s_.run_id + "' finished while this node waited to join", true);
  }
  if (c.spends_restart() && !may_restart(closed.restarts, max_restarts_)) {
    throw JobClosed(
        "job '" + s_.run_id + "' failed (no restarts left) while this node waited to join", false);
  }
  last_end_ = LastEnd{r, closed.restarts, c};
  std::string was = std::to_string(r), now = std::to_string(r + 1);
  co_await store_.compare_set("round", std::move(was), std::move(now));
}

RoundProtocol::awaitable<RoundProtocol::Attempt> RoundProtocol::try_round(int r, Keys expected) {
  Attempt a;
  Keys closed_key{key(r, "closed")};
  if (co_await store_.check(std::move(closed_key))) {
    a.closed = co_await read_closed(r, s_.read_timeout);  // running: wait as a spare
    co_return a;
  }
  // The will first: once counted, this node's death must end the round.
  std::string will = "dead:" + self_.id;
  co_await store_.set_will(key(r, "change"), "", std::move(will));
  const int index = static_cast<int>(co_await store_.add(key(r, "join"), 1)) - 1;
  std::vector<std::pair<std::string, std::string>> mine{{node_key(r, index), self_text_},
                                                        {key(r, "id/" + self_.id), "1"}};
  co_await store_.multi_set(std::move(mine));
  a.closed = co_await await_close(r, index, std::move(expected));
  if (index >= a.closed.n) {               // a spare, or the round was voided
    co_await store_.set_will("", "", "");  // a spare's death must not end the running round
    co_return a;
  }
  std::optional<std::string> members = co_await read_members(r, a.closed);
  if (!members) {
    // A member counted itself and died before describing itself, or the closer died before
    // writing the members (a will ended the round): this round cannot start; wait for its
    // end like a spare.
    co_await store_.set_will("", "", "");
    a.closed.n = 0;
    co_return a;
  }
  a.formed = make_formed(r, index, a.closed, *members);
  co_return a;
}

// Waits until round r is closed (by this node or another) and returns its record.
RoundProtocol::awaitable<RoundProtocol::Closed> RoundProtocol::await_close(int r, int index,
                                                                           Keys expected) {
  if (index >= s_.max_nodes) co_return co_await read_closed(r, s_.close_timeout);
  if (index == s_.max_nodes - 1) co_return co_await close_round(r);  // the max-th closes at once
  Keys closed_key{key(r, "closed")};
  if (co_await store_.check(closed_key)) co_return co_await read_closed(r, s_.read_timeout);
  if (index < s_.min_nodes - 1) {
    auto left = std::chrono::duration_cast<Millis>(join_deadline_ - Clock::now());
    Keys min_key{node_key(r, s_.min_nodes - 1)};
    if (left.count() <= 0 || !co_await store_.wait(std::move(min_key), left)) {
      co_await min_not_reached(r);
    }
  }
  if (!expected.empty()) {
    // Re-forming after a round ended: close as soon as its surviving members (and the node
    // that asked to join) are back; last_call_timeout bounds the wait for them.
    Keys ids;
    for (const auto& id : expected) ids.push_back(key(r, "id/" + id));
    co_await store_.wait(std::move(ids), s_.last_call_timeout);
    co_return co_await close_round(r);
  }
  // First formation (torchrun's rule): min nodes are here; wait last_call_timeout for more
  // unless max arrive (the max-th closes) or another node closes first.
  if (co_await store_.wait(std::move(closed_key), s_.last_call_timeout)) {
    co_return co_await read_closed(r, s_.read_timeout);
  }
  co_return co_await close_round(r);
}

// The closer gathers the members' descriptors into one key, once: every member then reads
// one value instead of N (N x N reads would dominate large rounds). nullopt: the round broke
// (its change key is set) before the members were known.
RoundProtocol::awaitable<std::optional<std::string>> RoundProtocol::read_members(int r,
                                                                                 const Closed& c) {
  Keys keys;
  if (c.won) {
    keys.reserve(static_cast<size_t>(c.n));
    for (int i = 0; i < c.n; ++i) keys.push_back(node_key(r, i));
  } else {
    keys.push_back(key(r, "members"));
  }
  if (co_await store_.wait(keys, s_.close_timeout)) {
    std::vector<std::string> values = co_await store_.multi_get(std::move(keys));
    if (!c.won) co_return std::move(values.at(0));
    std::string all;
    for (const auto& v : values) all += v + "\n";
    co_await store_.set(key(r, "members"), all);
    co_return all;
  }
  Keys change_key{key(r, "change")};
  if (co_await store_.check(std::move(change_key))) co_return std::nullopt;
  throw StoreError(StoreError::Kind::kTimeout,
                   "timed out after " + sys::seconds_text(s_.close_timeout) +
                       " (close_timeout) waiting for the members of round " + std::to_string(r));
}

FormedRound RoundProtocol::make_formed(int r, int index, const Closed& c,
                                       std::string_view members) {
  FormedRound f;
  f.round = r;
  f.index = index;
  f.restart_count = c.restarts;
  while (!members.empty()) {
    size_t nl = members.find('\n');
    try {
      f.nodes.push_back(decode_node_desc(members.substr(0, nl)));
    } catch (const std::invalid_argument& e) {
      throw RendezvousFailed(std::string("corrupt rendezvous state: ") + e.what());
    }
    members = nl == std::string_view::npos ? std::string_view() : members.substr(nl + 1);
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

RoundProtocol::awaitable<int> RoundProtocol::restarts_for(int r) {
  if (r == 0) co_return 0;
  if (!last_end_ || last_end_->round != r - 1) {
    // A newcomer closing a later round: read how the previous one ended.
    Closed prev = co_await read_closed(r - 1, s_.read_timeout);
    RoundChange c = RoundChange::parse(co_await store_.get(key(r - 1, "change"), s_.read_timeout));
    last_end_ = LastEnd{r - 1, prev.restarts, c};
  }
  // Recoveries in place (--in-process-recovery) spent restarts without ending the round.
  int in_place = 0;
  if (s_.in_process_recovery) {
    in_place = static_cast<int>(co_await store_.add(key(r - 1, "inplace"), 0));
  }
  co_return last_end_->restarts + in_place + (last_end_->change.spends_restart() ? 1 : 0);
}

RoundProtocol::awaitable<RoundProtocol::Closed> RoundProtocol::close_round(int r) {
  int joined = static_cast<int>(co_await store_.add(key(r, "join"), 0));
  int n = std::min(joined, s_.max_nodes);
  // A joiner died before the round closed (its will ended it): void the round (n = 0) so its
  // joiners move on together instead of starting workers with a dead member.
  Keys change_key{key(r, "change")};
  if (co_await store_.check(std::move(change_key))) n = 0;
  const int restarts = co_await restarts_for(r);
  std::string mine = nlohmann::json{{"n", n}, {"restarts", restarts}}.dump();
  const std::string stored = co_await store_.compare_set(key(r, "closed"), "", mine);
  Closed c = parse_closed(stored);
  // Nodes that proposed the same record all write the same members list: harmless.
  c.won = stored == mine;
  co_return c;
}

RoundProtocol::awaitable<RoundProtocol::Closed> RoundProtocol::read_closed(int r, Millis timeout) {
  co_return parse_closed(co_await store_.get(key(r, "closed"), timeout));
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

RoundProtocol::awaitable<void> RoundProtocol::min_not_reached(int r) {
  int joined = static_cast<int>(co_await store_.add(key(r, "join"), 0));
  throw RendezvousFailed("timed out after " + sys::seconds_text(s_.join_timeout) + " (" +
                         s_.join_timeout_key + ") waiting for " + std::to_string(s_.min_nodes) +
                         " node(s) of job '" + s_.run_id + "': only " + std::to_string(joined) +
                         " joined round " + std::to_string(r));
}

RoundProtocol::awaitable<RoundChange> RoundProtocol::end_round(int round, std::string value) {
  co_return RoundChange::parse(
      co_await store_.compare_set(key(round, "change"), "", std::move(value)));
}

RoundProtocol::awaitable<bool> RoundProtocol::report_success(FormedRound f) {
  int64_t ok = co_await store_.add(key(f.round, "ok"), 1);
  if (ok != static_cast<int64_t>(f.nodes.size())) co_return false;
  // Every node's workers exited 0: the job is done, whatever else happens now.
  co_await close_job("done");
  co_await store_.compare_set(key(f.round, "change"), "", "done");
  co_return true;
}

RoundProtocol::awaitable<void> RoundProtocol::close_job(std::string why) {
  co_await store_.compare_set("closed", "", std::move(why));
}

RoundProtocol::awaitable<void> RoundProtocol::say_bye(FormedRound f) {
  co_await store_.set(key(f.round, "bye/" + self_.id), "1");
}

RoundProtocol::awaitable<void> RoundProtocol::wait_byes(FormedRound f, Millis timeout) {
  Keys keys;
  for (const NodeDesc& n : f.nodes) {
    if (n.id != self_.id) keys.push_back(key(f.round, "bye/" + n.id));
  }
  if (!keys.empty()) co_await store_.wait(std::move(keys), timeout);
}

}  // namespace ddprun::agent
