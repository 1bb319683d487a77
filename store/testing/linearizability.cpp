#include "store/testing/linearizability.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <unordered_set>

#include "store/testing/store_model.hpp"

namespace ddprun::store::testing {
namespace {

using Verdict = CheckResult::Verdict;

// One operation ready for the search: interned keys, and the latest moment it may take effect.
struct Prepared {
  const Operation* op = nullptr;
  std::vector<int> keys;
  Clock::time_point bound;
  int steps = 1;  // WAIT: start, release; GET/MULTI_GET: start, release, read; others: 1
};

struct Problem {
  std::vector<std::string> key_names;
  std::vector<std::vector<Prepared>> clients;  // each in program order, timed-out ops left out
  size_t total_steps = 0;
};

void require(bool ok, const Operation& op, const char* what) {
  if (!ok) {
    throw std::invalid_argument("check_linearizable: " + std::string(what) + ": " +
                                describe(op, op.invoked));
  }
}

void validate(const Operation& op) {
  const size_t keys = op.keys.size(), values = op.values.size();
  const bool reply = op.outcome == Outcome::kReply;
  require(op.responded >= op.invoked, op, "responded before it was invoked");
  require(has_no_reply(op.kind) == (op.outcome == Outcome::kNoReply), op, "wrong outcome");
  require(op.outcome != Outcome::kTimedOut || waits_first(op.kind), op, "cannot time out");
  switch (op.kind) {
    case OpKind::kSet:
    case OpKind::kAppend:
    case OpKind::kQueuePush:
      return require(keys == 1 && values == 1, op, "needs one key and one value");
    case OpKind::kCompareSet:
      return require(keys == 1 && values == 2 && op.reply.size() == 1, op,
                     "needs a key, expected, desired and a reply");
    case OpKind::kGet:
      return require(keys == 1 && (!reply || op.reply.size() == 1), op, "needs a key, a reply");
    case OpKind::kMultiGet:
      return require(!reply || op.reply.size() == keys, op, "needs one reply per key");
    case OpKind::kMultiSet:
      return require(keys == values, op, "needs one value per key");
    case OpKind::kQueuePop:
      return require(keys == 1 && op.reply.size() <= 1, op, "needs a key, at most one reply");
    case OpKind::kAdd:
    case OpKind::kDeleteKey:
    case OpKind::kQueueLen:
      return require(keys == 1, op, "needs one key");
    case OpKind::kCheck:
    case OpKind::kWait:
    case OpKind::kNumKeys:
      return;
  }
}

Problem prepare(const std::vector<const Operation*>& ops) {
  Problem problem;
  std::map<std::string, int> interned;
  std::map<int, std::vector<const Operation*>> by_client;
  for (const Operation* op : ops) {
    validate(*op);
    by_client[op->client].push_back(op);
    for (const std::string& key : op->keys) {
      if (interned.emplace(key, static_cast<int>(interned.size())).second) {
        problem.key_names.push_back(key);
      }
    }
  }
  if (interned.size() > StoreModel::kMaxKeys) {
    throw std::invalid_argument("check_linearizable: more than 64 distinct keys");
  }
  for (auto& [client, list] : by_client) {
    std::stable_sort(list.begin(), list.end(), [](const Operation* a, const Operation* b) {
      return a->invoked < b->invoked;
    });
    for (size_t i = 1; i < list.size(); ++i) {
      require(list[i]->invoked >= list[i - 1]->responded, *list[i],
              "overlaps its client's previous operation");
    }
    // A no-reply operation is done once any later operation of its client has its reply
    // (a timed-out WAIT's CANCEL_WAIT reply counts too).
    std::vector<Prepared> chain(list.size());
    Clock::time_point next_reply = Clock::time_point::max();
    for (size_t i = list.size(); i-- > 0;) {
      const Operation& op = *list[i];
      chain[i].op = &op;
      chain[i].bound = op.outcome == Outcome::kNoReply ? next_reply : op.responded;
      if (op.outcome != Outcome::kNoReply) next_reply = op.responded;
      chain[i].steps = op.kind == OpKind::kWait ? 2 : waits_first(op.kind) ? 3 : 1;
      for (const std::string& key : op.keys) chain[i].keys.push_back(interned[key]);
    }
    std::erase_if(chain, [](const Prepared& p) { return p.op->outcome == Outcome::kTimedOut; });
    for (const Prepared& p : chain) problem.total_steps += p.steps;
    problem.clients.push_back(std::move(chain));
  }
  return problem;
}

// Applies an operation's single step (or GET/MULTI_GET's read) to `model`; false if the
// reply the client saw cannot be the model's.
bool apply(const Prepared& p, StoreModel& m) {
  const Operation& op = *p.op;
  const int key = p.keys.empty() ? 0 : p.keys[0];
  auto read = [&m](int k) {
    const std::string* v = m.find(k);
    return v ? *v : std::string();
  };
  switch (op.kind) {
    case OpKind::kSet:
      m.set(key, op.values[0]);
      return true;
    case OpKind::kAppend:
      m.append(key, op.values[0]);
      return true;
    case OpKind::kQueuePush:
      m.queue_push(key, op.values[0]);
      return true;
    case OpKind::kMultiSet:
      for (size_t i = 0; i < p.keys.size(); ++i) m.set(p.keys[i], op.values[i]);
      return true;
    case OpKind::kGet:
      return read(key) == op.reply[0];
    case OpKind::kMultiGet:
      for (size_t i = 0; i < p.keys.size(); ++i) {
        if (read(p.keys[i]) != op.reply[i]) return false;
      }
      return true;
    case OpKind::kAdd:
      return m.add(key, op.delta) == std::optional<int64_t>(op.number);
    case OpKind::kCompareSet:
      return m.compare_set(key, op.values[0], op.values[1]) == op.reply[0];
    case OpKind::kDeleteKey:
      return (m.erase(key) ? 1 : 0) == op.number;
    case OpKind::kCheck:
      return (m.check(p.keys) ? 1 : 0) == op.number;
    case OpKind::kNumKeys:
      return m.num_keys() == op.number;
    case OpKind::kQueueLen:
      return m.queue_len(key) == op.number;
    case OpKind::kQueuePop: {
      std::optional<std::string> popped = m.queue_pop(key);
      return op.reply.empty() ? !popped : popped == op.reply[0];
    }
    case OpKind::kWait:
      return false;  // handled as steps
  }
  return false;
}

class Search {
 public:
  Search(const Problem& problem, size_t max_states)
      : problem_(problem),
        max_states_(max_states),
        next_(problem.clients.size(), 0),
        step_(problem.clients.size(), 0),
        deepest_model_(problem.key_names.size()) {}

  Verdict run() {
    StoreModel model(problem_.key_names.size());
    if (dfs(model, 0)) return Verdict::kLinearizable;
    return gave_up_ ? Verdict::kGaveUp : Verdict::kNotLinearizable;
  }
  size_t states() const { return seen_.size(); }
  std::string stuck(Clock::time_point origin) const;

 private:
  const Prepared* current(size_t c) const {
    const auto& chain = problem_.clients[c];
    return next_[c] < chain.size() ? &chain[next_[c]] : nullptr;
  }

  // Takes client c's next step on `m`; false if the model forbids it.
  bool take_step(size_t c, StoreModel& m) const {
    const Prepared& p = *current(c);
    const int waiter = static_cast<int>(c);
    if (p.steps == 1) return apply(p, m);
    if (step_[c] == 0) {
      m.wait_start(waiter, p.keys);
      return true;
    }
    if (step_[c] == 1) {
      if (!m.wait_released(waiter)) return false;
      m.wait_end(waiter);
      return true;
    }
    return apply(p, m);
  }

  void advance(size_t c) {
    if (++step_[c] < current(c)->steps) return;
    step_[c] = 0;
    ++next_[c];
  }
  void retreat(size_t c) {
    if (step_[c] == 0) step_[c] = static_cast<uint8_t>(problem_.clients[c][--next_[c]].steps);
    --step_[c];
  }

  // Clients whose next step may come next: real time allows it (it was invoked before every
  // other client's pending operation must have taken effect). Started operations first.
  std::vector<size_t> candidates() const {
    Clock::time_point first = Clock::time_point::max(), second = first;
    size_t first_client = SIZE_MAX;
    for (size_t c = 0; c < next_.size(); ++c) {
      const Prepared* p = current(c);
      if (!p) continue;
      if (p->bound < first) {
        second = first;
        first = p->bound;
        first_client = c;
      } else if (p->bound < second) {
        second = p->bound;
      }
    }
    std::vector<size_t> out;
    for (size_t c = 0; c < next_.size(); ++c) {
      const Prepared* p = current(c);
      if (p && p->op->invoked <= (c == first_client ? second : first)) out.push_back(c);
    }
    std::stable_sort(out.begin(), out.end(), [this](size_t a, size_t b) {
      if ((step_[a] > 0) != (step_[b] > 0)) return step_[a] > 0;
      return current(a)->op->invoked < current(b)->op->invoked;
    });
    return out;
  }

  bool dfs(const StoreModel& model, size_t depth) {
    if (depth == problem_.total_steps) return true;
    std::string key(reinterpret_cast<const char*>(next_.data()), next_.size() * sizeof next_[0]);
    key.append(reinterpret_cast<const char*>(step_.data()), step_.size());
    model.encode(key);
    if (!seen_.insert(std::move(key)).second) return false;
    if (seen_.size() > max_states_) {
      gave_up_ = true;
      return false;
    }
    if (depth >= deepest_) {
      deepest_ = depth;
      deepest_next_ = next_;
      deepest_step_ = step_;
      deepest_model_ = model;
    }
    for (size_t c : candidates()) {
      StoreModel after = model;
      if (!take_step(c, after)) continue;
      advance(c);
      if (dfs(after, depth + 1)) return true;
      retreat(c);
      if (gave_up_) return false;
    }
    return false;
  }

  const Problem& problem_;
  size_t max_states_;
  std::vector<uint32_t> next_;
  std::vector<uint8_t> step_;
  std::unordered_set<std::string> seen_;
  bool gave_up_ = false;
  size_t deepest_ = 0;
  std::vector<uint32_t> deepest_next_;
  std::vector<uint8_t> deepest_step_;
  StoreModel deepest_model_;
};

std::string Search::stuck(Clock::time_point origin) const {
  size_t done = 0, total = 0;
  for (size_t c = 0; c < problem_.clients.size(); ++c) {
    done += deepest_next_.empty() ? 0 : deepest_next_[c];
    total += problem_.clients[c].size();
  }
  std::string out = "The longest legal order found takes " + std::to_string(done) + " of " +
                    std::to_string(total) + " operations (timed-out ones left out); after it " +
                    "the store holds " + deepest_model_.describe(problem_.key_names) +
                    ", and no client's next operation fits:";
  Clock::time_point first = Clock::time_point::max();
  for (size_t c = 0; c < problem_.clients.size(); ++c) {
    if (deepest_next_[c] < problem_.clients[c].size()) {
      first = std::min(first, problem_.clients[c][deepest_next_[c]].bound);
    }
  }
  for (size_t c = 0; c < problem_.clients.size(); ++c) {
    if (deepest_next_[c] >= problem_.clients[c].size()) continue;
    const Prepared& p = problem_.clients[c][deepest_next_[c]];
    out += " " + describe(*p.op, origin);
    if (deepest_step_[c] == 1) out += " (its WAIT has started)";
    if (deepest_step_[c] == 2) out += " (its WAIT was released)";
    if (p.op->invoked > first) out += " (began after another pending operation returned)";
    out += ";";
  }
  out.back() = '.';
  return out;
}

CheckResult check_ops(const std::vector<const Operation*>& ops, size_t max_states,
                      Clock::time_point origin, bool explain) {
  Problem problem = prepare(ops);
  Search search(problem, max_states);
  CheckResult result;
  result.verdict = search.run();
  result.states = search.states();
  if (explain && result.verdict == Verdict::kNotLinearizable) {
    result.explanation = search.stuck(origin);
  }
  if (result.verdict == Verdict::kGaveUp) {
    result.explanation = "Gave up after " + std::to_string(max_states) +
                         " states without deciding (CheckOptions::max_states); " +
                         std::to_string(ops.size()) + " operations.";
  }
  return result;
}

// Drops, in halving chunks, operations that change nothing while the rest still fails.
std::vector<const Operation*> shrink(std::vector<const Operation*> ops, const CheckOptions& options,
                                     Clock::time_point origin) {
  size_t checks = 0;
  const size_t per_check = std::min<size_t>(options.max_states, 200'000);
  for (size_t chunk = ops.size() / 2; chunk >= 1 && checks < options.shrink_checks; chunk /= 2) {
    for (size_t at = 0; at < ops.size() && checks < options.shrink_checks;) {
      std::vector<const Operation*> trial(ops.begin(), ops.begin() + at);
      size_t end = std::min(ops.size(), at + chunk), dropped = 0;
      for (size_t i = at; i < end; ++i) {
        if (changes_nothing(*ops[i]) || ops[i]->outcome == Outcome::kTimedOut) {
          ++dropped;
        } else {
          trial.push_back(ops[i]);
        }
      }
      trial.insert(trial.end(), ops.begin() + end, ops.end());
      bool still_fails = false;
      if (dropped > 0) {
        ++checks;
        still_fails =
            check_ops(trial, per_check, origin, false).verdict == Verdict::kNotLinearizable;
      }
      if (still_fails) {
        ops = std::move(trial);
        at += (end - at) - dropped;
      } else {
        at = end;
      }
    }
  }
  return ops;
}

}  // namespace

CheckResult check_linearizable(const History& history, const CheckOptions& options) {
  const Clock::time_point origin = history_origin(history);
  std::vector<const Operation*> ops;
  std::unordered_set<int> clients;
  for (const Operation& op : history) {
    ops.push_back(&op);
    clients.insert(op.client);
  }
  std::stable_sort(ops.begin(), ops.end(),
                   [](const Operation* a, const Operation* b) { return a->invoked < b->invoked; });
  CheckResult result = check_ops(ops, options.max_states, origin, true);
  if (result.verdict != Verdict::kNotLinearizable) return result;
  std::string summary = "Not linearizable: no order of these " + std::to_string(ops.size()) +
                        " operations by " + std::to_string(clients.size()) +
                        " clients fits the store's semantics and their timing. ";
  result.explanation = summary + result.explanation;
  if (options.shrink_checks == 0) return result;
  std::vector<const Operation*> small = shrink(ops, options, origin);
  constexpr size_t kListed = 40;
  result.explanation += " A sub-history of " + std::to_string(small.size()) +
                        " operations fails as well (operations that change nothing dropped):";
  for (size_t i = 0; i < small.size() && i < kListed; ++i) {
    result.explanation += " " + describe(*small[i], origin) + ";";
  }
  if (small.size() > kListed) {
    result.explanation += " ... and " + std::to_string(small.size() - kListed) + " more.";
  } else {
    result.explanation.back() = '.';
  }
  return result;
}

}  // namespace ddprun::store::testing
