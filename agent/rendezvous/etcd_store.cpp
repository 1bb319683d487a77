#include "agent/rendezvous/etcd_store.hpp"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "agent/rendezvous/etcd_store_state.hpp"
#include "store/client.hpp"
#include "store/sys/log.hpp"
#include "store/sys/random.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;
using etcd::Clock;
using etcd::Compare;
using etcd::Deadline;
using etcd::EtcdError;
using etcd::Op;
using store::StoreError;
using namespace etcd_store_detail;

namespace {

constexpr size_t kMaxTxnOps = 128;  // etcd's default --max-txn-ops

StoreError store_error(const EtcdError& e) {
  switch (e.kind()) {
    case EtcdError::Kind::kClosed:
      return StoreError(StoreError::Kind::kClosed, e.what());
    case EtcdError::Kind::kUnavailable:
      return StoreError(StoreError::Kind::kConnect, e.what());
    default:
      return StoreError(StoreError::Kind::kProtocol, e.what());
  }
}

int64_t decimal(const std::string& key, const std::string& text) {
  if (text.empty()) return 0;
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size()) {
    throw StoreError(StoreError::Kind::kProtocol,
                     "etcd key '" + key + "' holds '" + text.substr(0, 40) + "', not a number");
  }
  return v;
}

}  // namespace

void EtcdStore::State::seen(int64_t revision) {
  if (will_rev != 0 || closed) return;
  will_rev = revision;
  if (opts.apply_wills && !applying) {
    applying = true;
    asio::co_spawn(executor, apply_wills(shared_from_this()), asio::detached);
  }
}

EtcdStore::EtcdStore(asio::any_io_executor executor, EtcdStoreOptions options)
    : st_(std::make_shared<State>(std::move(executor), std::move(options))) {}

EtcdStore::~EtcdStore() {
  close();
}

int64_t EtcdStore::lease() const {
  return st_->lease;
}

void EtcdStore::close() {
  if (st_->closed) return;
  st_->closed = true;
  st_->keep_timer.cancel();
  st_->client.close();
  st_->keeper.close();
  st_->will_client.close();
  if (st_->watch) st_->watch->close();
  if (st_->will_watch) st_->will_watch->close();
}

void EtcdStore::abandon() {
  st_->keeping = false;
  st_->keep_timer.cancel();
  st_->keeper.close();
}

// A counter is its key's own value plus the number of +1 marks under "<key>/+/". A +1 is a
// new mark (no contention: N nodes joining at once make N writes, not N^2 retries), and its
// result is the counter as of the mark's creation: a consistent read at that revision.
asio::awaitable<int64_t> counter_at(EtcdStore::State& st, const std::string& key, int64_t revision,
                                    Deadline deadline) {
  const std::string marks = key + "/+/";
  etcd::RangeOptions at{revision, false};
  etcd::RangeResult base = co_await st.client.range(key, "", deadline, at);
  at.count_only = true;
  etcd::RangeResult n = co_await st.client.range(marks, etcd::prefix_end(marks), deadline, at);
  st.seen(n.revision);
  co_return (base.kvs.empty() ? 0 : decimal(key, base.kvs[0].value)) + n.count;
}

asio::awaitable<int64_t> EtcdStore::add(std::string key, int64_t delta) {
  auto st = st_;
  try {
    const Deadline deadline = st->op_deadline();
    if (delta == 0) co_return co_await counter_at(*st, key, 0, deadline);
    if (delta == 1) {
      // The mark's name is this operation's: a retry after a lost reply rewrites the same
      // key, whose create revision (read back in the same transaction) does not change.
      const std::string mark = key + "/+/" + st->id + "-" + std::to_string(++st->op_seq);
      std::vector<Op> ops{{Op::Kind::kPut, mark, {}, 0}, {Op::Kind::kRange, mark, {}, 0}};
      etcd::TxnResult r = co_await st->client.txn({}, std::move(ops), {}, deadline);
      if (r.ranges.empty() || !r.ranges[0]) {
        throw StoreError(StoreError::Kind::kProtocol, "etcd txn reply: no mark");
      }
      co_return co_await counter_at(*st, key, r.ranges[0]->create_revision, deadline);
    }
    // Any other delta: compare-and-set on the key's own value (marks add to it).
    const std::string marker =
        st->opts.job_prefix + "op/" + st->id + "/" + std::to_string(++st->op_seq);
    int64_t value = 0, mod = 0;  // first try: as if the key were absent
    for (;;) {
      const std::string next = std::to_string(value + delta);
      std::vector<Compare> cmp{{Compare::Target::kMod, key, mod, {}},
                               {Compare::Target::kCreate, marker, 0, {}}};
      std::vector<Op> ok{{Op::Kind::kPut, key, next, 0}, {Op::Kind::kPut, marker, next, 0}};
      std::vector<Op> no{{Op::Kind::kRange, key, {}, 0}, {Op::Kind::kRange, marker, {}, 0}};
      etcd::TxnResult r =
          co_await st->client.txn(std::move(cmp), std::move(ok), std::move(no), deadline);
      st->seen(r.revision);
      if (r.succeeded) co_return co_await counter_at(*st, key, r.revision, deadline);
      if (r.ranges.size() < 2) throw StoreError(StoreError::Kind::kProtocol, "etcd txn reply");
      if (r.ranges[1]) {  // the first try landed
        co_return co_await counter_at(*st, key, r.ranges[1]->create_revision, deadline);
      }
      value = r.ranges[0] ? decimal(key, r.ranges[0]->value) : 0;
      mod = r.ranges[0] ? r.ranges[0]->mod_revision : 0;
    }
  } catch (const EtcdError& e) {
    throw store_error(e);
  }
}

asio::awaitable<std::string> EtcdStore::compare_set(std::string key, std::string expected,
                                                    std::string desired) {
  auto st = st_;
  try {
    std::vector<Compare> cmp{cas_compare(key, expected)};
    std::vector<Op> ok{{Op::Kind::kPut, key, desired, 0}};
    std::vector<Op> no{{Op::Kind::kRange, key, {}, 0}};
    etcd::TxnResult r =
        co_await st->client.txn(std::move(cmp), std::move(ok), std::move(no), st->op_deadline());
    st->seen(r.revision);
    if (r.succeeded) co_return desired;
    if (!r.ranges.empty() && r.ranges[0]) co_return r.ranges[0]->value;
    co_return expected;  // absent, and `expected` was not "": torch's answer
  } catch (const EtcdError& e) {
    throw store_error(e);
  }
}

namespace {

// The values of `keys` (nullopt = absent), in transactions of at most kMaxTxnOps reads; the
// revision of the first.
asio::awaitable<std::pair<std::vector<std::optional<std::string>>, int64_t>> read_keys(
    EtcdStore::State& st, const std::vector<std::string>& keys, Deadline deadline) {
  std::vector<std::optional<std::string>> values;
  int64_t revision = 0;
  for (size_t i = 0; i < keys.size() || (keys.empty() && i == 0); i += kMaxTxnOps) {
    std::vector<Op> ops;
    for (size_t k = i; k < std::min(keys.size(), i + kMaxTxnOps); ++k) {
      ops.push_back({Op::Kind::kRange, keys[k], {}, 0});
    }
    etcd::TxnResult r = co_await st.client.txn({}, std::move(ops), {}, deadline);
    st.seen(r.revision);
    if (revision == 0) revision = r.revision;
    for (auto& kv : r.ranges) {
      values.push_back(kv ? std::optional<std::string>(std::move(kv->value)) : std::nullopt);
    }
    if (keys.empty()) break;
  }
  if (values.size() != keys.size()) {
    throw StoreError(StoreError::Kind::kProtocol, "etcd txn reply: wrong number of reads");
  }
  co_return std::make_pair(std::move(values), revision);
}

}  // namespace

asio::awaitable<bool> EtcdStore::check(std::vector<std::string> keys) {
  auto st = st_;
  try {
    auto [values, rev] = co_await read_keys(*st, keys, st->op_deadline());
    co_return std::all_of(values.begin(), values.end(),
                          [](const auto& v) { return v.has_value(); });
  } catch (const EtcdError& e) {
    throw store_error(e);
  }
}

asio::awaitable<std::vector<std::string>> EtcdStore::multi_get(std::vector<std::string> keys) {
  auto st = st_;
  try {
    auto [values, rev] = co_await read_keys(*st, keys, st->op_deadline());
    std::vector<std::string> out;
    out.reserve(values.size());
    for (auto& v : values) out.push_back(v ? std::move(*v) : std::string());
    co_return out;
  } catch (const EtcdError& e) {
    throw store_error(e);
  }
}

asio::awaitable<void> EtcdStore::multi_set(std::vector<std::pair<std::string, std::string>> kvs) {
  auto st = st_;
  try {
    const Deadline deadline = st->op_deadline();
    for (size_t i = 0; i < kvs.size(); i += kMaxTxnOps) {
      std::vector<Op> ops;
      for (size_t k = i; k < std::min(kvs.size(), i + kMaxTxnOps); ++k) {
        ops.push_back({Op::Kind::kPut, std::move(kvs[k].first), std::move(kvs[k].second), 0});
      }
      etcd::TxnResult r = co_await st->client.txn({}, std::move(ops), {}, deadline);
      st->seen(r.revision);
    }
  } catch (const EtcdError& e) {
    throw store_error(e);
  }
}

asio::awaitable<void> EtcdStore::set_will(std::string key, std::string expected,
                                          std::string desired) {
  auto st = st_;
  try {
    if (st->lease == 0) {
      co_await new_lease(*st, st->client);
      st->keeping = true;
      asio::co_spawn(st->executor, keep_lease(st), asio::detached);
    }
    // The will names this store (the node), so that the others recognise it written again
    // under a new lease; a cleared will names only that.
    nlohmann::json will{{"n", st->id}};
    if (!key.empty()) {
      will["k"] = etcd::base64_encode(key);
      will["e"] = etcd::base64_encode(expected);
      will["d"] = etcd::base64_encode(desired);
    }
    st->will_value = will.dump();
    for (int attempt = 0;; ++attempt) {
      try {
        co_await write_will(*st, st->client);
        break;
      } catch (const EtcdError& e) {
        if (attempt > 0 || e.kind() != EtcdError::Kind::kRequest ||
            std::string(e.what()).find("lease not found") == std::string::npos) {
          throw;
        }
      }
      // The lease expired while this node was cut off from etcd (the keep-alive may not have
      // noticed yet): it comes back with a new lease.
      st->lease_ended(Clock::now());
      sys::log_line("etcd lease " + hex(st->lease) +
                    " expired (this node was cut off from etcd "
                    "for longer than its TTL): taking a new lease");
      co_await new_lease(*st, st->client);
    }
  } catch (const EtcdError& e) {
    throw store_error(e);
  }
}

asio::awaitable<void> EtcdStore::end(Millis timeout) {
  auto st = st_;
  st->keeping = false;
  st->keep_timer.cancel();
  if (st->lease && !st->closed) {
    try {
      co_await st->client.lease_revoke(st->lease, Clock::now() + timeout);
      if (st->opts.on_lease) st->opts.on_lease(0);
    } catch (const std::exception&) {
      // etcd is unreachable: the lease expires after its TTL (and the guardian retries).
    }
  }
  close();
}

asio::awaitable<bool> EtcdStore::wait(std::vector<std::string> keys, Millis timeout) {
  auto st = st_;
  const Deadline deadline = timeout.count() > 0 ? Clock::now() + timeout : etcd::kNoDeadline;
  if (keys.empty()) co_return true;
  // One watch over the smallest range holding every key; events on keys in between are
  // ignored.
  const auto [lo, hi] = std::minmax_element(keys.begin(), keys.end());
  const std::string first = *lo, end = *hi + std::string(1, '\0');
  try {
    for (;;) {
      auto [values, rev] = co_await read_keys(*st, keys, deadline);
      std::map<std::string, bool> present;
      for (size_t i = 0; i < keys.size(); ++i) present[keys[i]] = values[i].has_value();
      auto all = [&] {
        return std::all_of(present.begin(), present.end(), [](const auto& p) { return p.second; });
      };
      if (all()) co_return true;
      // One watch object per store: it remembers which member answered last.
      if (!st->watch) st->watch = std::make_unique<etcd::EtcdWatch>(st->executor, st->opts.client);
      auto& watch = *st->watch;
      try {
        co_await watch.start(first, end, rev + 1, deadline);
        for (;;) {
          // A member that stopped (SIGSTOP, a hung process) keeps its TCP connections open
          // and answers nothing: a watch quiet for a keep-alive interval is checked by
          // reading again (one small read per interval while nothing happens).
          auto batch = co_await watch.next(std::min(deadline, Clock::now() + st->opts.quiet()));
          if (!batch && Clock::now() >= deadline) co_return false;  // etcd answering
          if (!batch) break;
          for (const auto& ev : *batch) {
            auto it = present.find(ev.kv.key);
            if (it != present.end()) it->second = !ev.deleted;
          }
          if (all()) co_return true;
        }
      } catch (const EtcdError& e) {
        if (e.kind() != EtcdError::Kind::kUnavailable || Clock::now() >= deadline) throw;
        // The watch was lost (a member went away): read again and watch from there.
      }
    }
  } catch (const EtcdError& e) {
    throw store_error(e);
  }
}

}  // namespace ddprun::agent
