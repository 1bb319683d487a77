#include "store/testing/workload.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <latch>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>

namespace ddprun::store::testing {
namespace {

// Relative weights of the operations a client draws.
constexpr std::pair<OpKind, int> kMix[] = {
    {OpKind::kSet, 11},        {OpKind::kGet, 11},      {OpKind::kAdd, 13},
    {OpKind::kCompareSet, 12}, {OpKind::kDeleteKey, 6}, {OpKind::kCheck, 6},
    {OpKind::kWait, 8},        {OpKind::kMultiGet, 5},  {OpKind::kMultiSet, 6},
    {OpKind::kAppend, 3},      {OpKind::kNumKeys, 5},   {OpKind::kQueuePush, 5},
    {OpKind::kQueuePop, 5},    {OpKind::kQueueLen, 4},
};

class Worker {
 public:
  Worker(int id, const WorkloadOptions& options, Client& client, std::atomic<int>& next_id)
      : id_(id),
        options_(options),
        client_(client),
        next_id_(next_id),
        rng_(options.seed * 1000003 + id) {
    for (const auto& name : options.keys) names_.push_back(name);
    for (const auto& name : options.queues) {
      if (std::find(names_.begin(), names_.end(), name) == names_.end()) names_.push_back(name);
    }
  }

  // Runs the client's operations; the history so far is kept if one throws.
  void run(const std::string& host, uint16_t port, std::vector<Operation>& out) {
    while (out.size() < static_cast<size_t>(options_.ops_per_client)) {
      Operation op = draw();
      if (op.kind == OpKind::kMultiGet) {
        if (!reader_) connect_reader(host, port);
        op.client = reader_id_;
        if (!perform(*reader_, op, out)) reader_.reset();
      } else {
        perform(client_, op, out);
      }
    }
  }

 private:
  // Client::multi_get() waits with the call deadline, so MULTI_GET goes over a connection of
  // its own whose deadline is the longest WAIT; one that timed out is replaced (the deadline
  // may have struck mid-reply). Each is a client of its own in the history.
  void connect_reader(const std::string& host, uint16_t port) {
    ClientOptions options = options_.client;
    options.timeout = options_.max_wait;
    try {
      reader_ = Client::connect(host, port, options);
    } catch (const StoreError& e) {
      throw std::runtime_error(std::string("connecting for MULTI_GET: ") + e.what());
    }
    reader_id_ = next_id_++;
  }

  int64_t uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  template <typename T>
  const T& pick(const std::vector<T>& items) {
    return items[uniform(0, static_cast<int64_t>(items.size()) - 1)];
  }
  std::string number() { return std::to_string(uniform(-1, 5)); }
  // `count` distinct names from `from`.
  std::vector<std::string> distinct(const std::vector<std::string>& from, size_t count) {
    std::vector<std::string> all = from;
    std::shuffle(all.begin(), all.end(), rng_);
    all.resize(std::min(count, all.size()));
    return all;
  }
  // COMPARE_SET's expected value: one this client saw at the key lately, absent, or a guess.
  std::string expected(const std::string& key) {
    const auto& seen = seen_[key];
    int64_t roll = uniform(0, 3);
    if (roll <= 1 && !seen.empty()) return roll == 0 ? seen.back() : pick(seen);
    return roll == 2 ? std::string() : number();
  }
  void saw(const std::string& key, std::string value) {
    auto& seen = seen_[key];
    seen.push_back(std::move(value));
    if (seen.size() > 3) seen.erase(seen.begin());
  }

  OpKind draw_kind() {
    int total = 0;
    for (const auto& [kind, weight] : kMix) total += weight;
    int64_t roll = uniform(0, total - 1);
    for (const auto& [kind, weight] : kMix) {
      if ((roll -= weight) < 0) return kind;
    }
    return OpKind::kSet;
  }

  Operation draw() {
    Operation op;
    op.client = id_;
    op.kind = draw_kind();
    op.outcome = has_no_reply(op.kind) ? Outcome::kNoReply : Outcome::kReply;
    const std::string& key = pick(options_.keys);
    switch (op.kind) {
      case OpKind::kSet:
        op.keys = {key};
        op.values = {number()};
        break;
      case OpKind::kAppend:
        op.keys = {key};
        op.values = {std::to_string(uniform(1, 9))};
        break;
      case OpKind::kAdd:
        op.keys = {key};
        op.delta = uniform(-2, 3);
        break;
      case OpKind::kCompareSet:
        op.keys = {key};
        op.values = {expected(key), number()};
        break;
      case OpKind::kGet:
      case OpKind::kDeleteKey:
        op.keys = {key};
        break;
      case OpKind::kCheck:
      case OpKind::kWait:
        op.keys = distinct(names_, uniform(1, 3));
        break;
      case OpKind::kMultiGet:
        op.keys = distinct(options_.keys, 2);
        break;
      case OpKind::kMultiSet:
        op.keys = distinct(options_.keys, 2);
        for (size_t i = 0; i < op.keys.size(); ++i) op.values.push_back(number());
        break;
      case OpKind::kNumKeys:
        break;
      case OpKind::kQueuePush:
        op.keys = {pick(options_.queues)};
        op.values = {"c" + std::to_string(id_) + "." + std::to_string(pushed_++)};
        break;
      case OpKind::kQueuePop:
      case OpKind::kQueueLen:
        op.keys = {pick(options_.queues)};
        break;
    }
    return op;
  }

  // The store call of `op`; what it returns goes into op.reply or op.number.
  static void call(Client& client, Operation& op, const std::string& key,
                   std::chrono::milliseconds timeout) {
    switch (op.kind) {
      case OpKind::kSet:
        client.set(key, op.values[0]);
        break;
      case OpKind::kAppend:
        client.append(key, op.values[0]);
        break;
      case OpKind::kQueuePush:
        client.queue_push(key, op.values[0]);
        break;
      case OpKind::kMultiSet: {
        std::vector<std::pair<std::string, std::string>> pairs;
        for (size_t i = 0; i < op.keys.size(); ++i) pairs.emplace_back(op.keys[i], op.values[i]);
        client.multi_set(pairs);
        break;
      }
      case OpKind::kGet:
        op.reply = {client.get(key, timeout)};
        break;
      case OpKind::kMultiGet:
        op.reply = client.multi_get(op.keys);
        break;
      case OpKind::kWait:
        client.wait(op.keys, timeout);
        break;
      case OpKind::kAdd:
        op.number = client.add(key, op.delta);
        break;
      case OpKind::kCompareSet:
        op.reply = {client.compare_set(key, op.values[0], op.values[1])};
        break;
      case OpKind::kDeleteKey:
        op.number = client.delete_key(key) ? 1 : 0;
        break;
      case OpKind::kCheck:
        op.number = client.check(op.keys) ? 1 : 0;
        break;
      case OpKind::kNumKeys:
        op.number = client.num_keys();
        break;
      case OpKind::kQueueLen:
        op.number = client.queue_len(key);
        break;
      case OpKind::kQueuePop: {
        std::optional<std::string> popped = client.queue_pop(key);
        if (popped) op.reply = {*popped};
        break;
      }
    }
  }

  // Calls the store and records the operation; false if it timed out waiting.
  bool perform(Client& client, Operation& op, std::vector<Operation>& out) {
    const std::string& key = op.keys.empty() ? std::string() : op.keys[0];
    const auto timeout =
        std::chrono::milliseconds(uniform(options_.min_wait.count(), options_.max_wait.count()));
    op.invoked = Clock::now();
    try {
      call(client, op, key, timeout);
    } catch (const StoreError& e) {
      if (e.kind() != StoreError::Kind::kTimeout || !waits_first(op.kind)) {
        throw std::runtime_error(std::string(op_name(op.kind)) + " failed: " + e.what());
      }
      op.outcome = Outcome::kTimedOut;
    }
    op.responded = Clock::now();
    remember(op);
    out.push_back(op);
    return op.outcome != Outcome::kTimedOut;
  }

  void remember(const Operation& op) {
    if (op.outcome == Outcome::kTimedOut) return;
    if (op.kind == OpKind::kAdd) saw(op.keys[0], std::to_string(op.number));
    if (op.kind == OpKind::kSet || op.kind == OpKind::kMultiSet) {
      for (size_t i = 0; i < op.keys.size(); ++i) saw(op.keys[i], op.values[i]);
    }
    if (op.kind == OpKind::kGet || op.kind == OpKind::kCompareSet || op.kind == OpKind::kMultiGet) {
      for (size_t i = 0; i < op.keys.size(); ++i) {
        if (!op.reply[i].empty()) saw(op.keys[i], op.reply[i]);
      }
    }
  }

  const int id_;
  const WorkloadOptions& options_;
  Client& client_;
  std::atomic<int>& next_id_;  // client ids for the MULTI_GET connections
  std::unique_ptr<Client> reader_;
  int reader_id_ = -1;
  std::mt19937_64 rng_;
  std::vector<std::string> names_;  // keys and queue names, for CHECK and WAIT
  std::map<std::string, std::vector<std::string>> seen_;
  int pushed_ = 0;
};

}  // namespace

History run_workload(const std::string& host, uint16_t port, const WorkloadOptions& options) {
  const std::string where = "workload seed " + std::to_string(options.seed) + " on " + host + ":" +
                            std::to_string(port) + ": ";
  std::vector<std::unique_ptr<Client>> clients;
  try {
    for (int c = 0; c < options.clients; ++c) {
      clients.push_back(Client::connect(host, port, options.client));
    }
  } catch (const StoreError& e) {
    throw std::runtime_error(where + e.what());
  }
  std::vector<std::vector<Operation>> recorded(options.clients);
  std::vector<std::string> errors(options.clients);
  std::latch start(options.clients);
  std::atomic<int> next_id{options.clients};
  std::vector<std::thread> threads;
  for (int c = 0; c < options.clients; ++c) {
    threads.emplace_back([&, c] {
      Worker worker(c, options, *clients[c], next_id);
      start.arrive_and_wait();
      try {
        worker.run(host, port, recorded[c]);
      } catch (const std::exception& e) {
        errors[c] = "client " + std::to_string(c) + " failed at operation " +
                    std::to_string(recorded[c].size()) + ": " + e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& error : errors) {
    if (!error.empty()) throw std::runtime_error(where + error);
  }
  History history;
  for (auto& ops : recorded) history.insert(history.end(), ops.begin(), ops.end());
  std::sort(history.begin(), history.end(),
            [](const Operation& a, const Operation& b) { return a.invoked < b.invoked; });
  return history;
}

}  // namespace ddprun::store::testing
