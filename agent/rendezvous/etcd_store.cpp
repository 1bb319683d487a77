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

// compare_set's condition: "" = the key is absent (its create revision is 0), else its value.
Compare cas_compare(const std::string& key, const std::string& expected) {
  return expected.empty() ? Compare{Compare::Target::kCreate, key, 0, {}}
                          : Compare{Compare::Target::kValue, key, 0, expected};
}

std::string hex(int64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

struct EtcdStore::State : std::enable_shared_from_this<EtcdStore::State> {
  State(asio::any_io_executor ex, EtcdStoreOptions o)
      : executor(ex),
        opts(std::move(o)),
        client(ex, opts.client),
        keeper(ex, keeper_options(opts.client)),
        will_client(ex, opts.client),
        keep_timer(ex),
        id(sys::random_hex(6)) {}

  static etcd::Options keeper_options(etcd::Options o) {
    // The keep-alive connection is the one always in use while workers train: it tells the
    // person when etcd stops and starts answering.
    o.on_outage = [](const std::string& line) {
      sys::log_line(line.rfind("etcd unreachable", 0) == 0
                        ? line + " (running workers go on; what needs etcd waits for it)"
                        : line);
    };
    return o;
  }

  Deadline op_deadline() const { return Clock::now() + opts.op_timeout; }
  // How long a will that ended with etcd's absence waits for its node to write it again: a
  // lease TTL and two keep-alive intervals from when etcd answers again (the node learns that
  // its lease ended on its first keep-alive after that, within an interval and one attempt,
  // then takes a new lease and writes its will: two requests).
  Clock::duration grace() const { return opts.lease_ttl + 2 * opts.keep_alive_every; }
  // Whether this node's own lease ended lately (within a grace) while this node was alive:
  // etcd did not answer it for longer than the TTL.
  bool own_lease_ended_lately(Clock::time_point now) const {
    return own_lease_ended && now - *own_lease_ended < grace();
  }
  // A silence of the keeper this long means etcd is not answering this node now.
  Clock::duration silent_after() const { return opts.keep_alive_every * 3 / 2; }
  // The keeper heard from etcd (any answer about the lease).
  void answer(Clock::time_point now) {
    if (answered != Clock::time_point() && now - answered > silent_after()) away_ended = now;
    answered = now;
  }
  void lease_ended(Clock::time_point now) { own_lease_ended = now; }
  std::string will_key() const { return opts.job_prefix + "will/" + hex(lease); }
  std::string will_prefix() const { return opts.job_prefix + "will/"; }

  // The first revision this client saw: wills are applied from there on.
  void seen(int64_t revision);

  asio::any_io_executor executor;
  EtcdStoreOptions opts;
  etcd::EtcdClient client;                      // the operations
  etcd::EtcdClient keeper;                      // the lease's keep-alives
  etcd::EtcdClient will_client;                 // the will applier's compare-and-sets
  std::unique_ptr<etcd::EtcdWatch> watch;       // wait()'s
  std::unique_ptr<etcd::EtcdWatch> will_watch;  // the will applier's
  asio::steady_timer keep_timer;
  std::string id;  // names this client's operation markers
  int64_t op_seq = 0;
  int64_t lease = 0;
  std::string will_value;  // "" = none yet; a cleared will names only the node
  int64_t will_rev = 0;    // this client's first revision: wills are applied from there on
  int64_t will_lease = 0;  // the lease will_value was last written with
  bool applying = false;   // the will applier runs
  bool keeping = false;
  Clock::time_point answered;                        // the keeper's last answer from etcd
  std::optional<Clock::time_point> away_ended;       // etcd answered the keeper after a silence
  std::optional<Clock::time_point> own_lease_ended;  // seen ended while this node was alive
  bool closed = false;
};

namespace {
asio::awaitable<void> apply_wills(std::shared_ptr<EtcdStore::State> st);
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

namespace {

// A fresh lease of the store's TTL, through `client`, made this client's (and the guardian's).
asio::awaitable<void> new_lease(EtcdStore::State& st, etcd::EtcdClient& client) {
  const auto secs = std::chrono::ceil<std::chrono::seconds>(st.opts.lease_ttl).count();
  st.lease = co_await client.lease_grant(std::max<int64_t>(secs, 1), st.op_deadline());
  st.answer(Clock::now());
  if (st.opts.on_lease) st.opts.on_lease(st.lease);
}

// Writes the will under the current lease, until what was written is the current will under
// the current lease (set_will and the keeper may both write it; the last word is the latest).
asio::awaitable<void> write_will(EtcdStore::State& st, etcd::EtcdClient& client) {
  for (;;) {
    const int64_t lease = st.lease;
    const std::string value = st.will_value;
    std::vector<Op> put{{Op::Kind::kPut, st.will_key(), value, lease}};
    etcd::TxnResult r = co_await client.txn({}, std::move(put), {}, st.op_deadline());
    st.seen(r.revision);
    st.will_lease = lease;
    if (st.lease == lease && st.will_value == value) co_return;
  }
}

// Keeps the lease alive every keep_alive_every until the store closes; replaces a lease that
// expired anyway (etcd unreachable for longer than its TTL) and writes the will again.
asio::awaitable<void> keep_lease(std::shared_ptr<EtcdStore::State> st) {
  auto kept = Clock::now();  // the lease lives until kept + TTL
  while (st->keeping && !st->closed) {
    st->keep_timer.expires_after(st->opts.keep_alive_every);
    boost::system::error_code ec;
    co_await st->keep_timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (!st->keeping || st->closed) break;
    try {
      // Every member in turn until the lease would end, then one interval more at a time.
      const Deadline d =
          std::max(kept + st->opts.lease_ttl, Clock::now() + st->opts.keep_alive_every);
      int64_t ttl = co_await st->keeper.lease_keep_alive(st->lease, d);
      st->answer(Clock::now());
      if (!st->keeping) break;
      if (ttl > 0) {
        kept = Clock::now();
      } else {
        st->lease_ended(Clock::now());
        sys::log_line("etcd lease " + hex(st->lease) +
                      " expired (no answer from etcd for longer than its TTL): taking a new "
                      "lease and writing this node's will again");
        co_await new_lease(*st, st->keeper);
        kept = Clock::now();
      }
      // The will under the current lease (again, if a write of it failed).
      if (st->will_lease != st->lease) co_await write_will(*st, st->keeper);
    } catch (const EtcdError& e) {
      if (e.kind() == EtcdError::Kind::kClosed) break;
      // Unavailable: the keeper's outage report has said so; try again next interval.
    } catch (const std::exception&) {
    }
  }
}

}  // namespace

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

// A will found deleted (its agent's lease ended): apply its compare-and-set. Every agent of
// the job does this; the first one wins and the others' compare fails.
asio::awaitable<void> apply_will(EtcdStore::State& st, const std::string& will) {
  std::string key, expected, desired;
  try {
    auto j = nlohmann::json::parse(will);
    key = etcd::base64_decode(j.at("k").get<std::string>());
    expected = etcd::base64_decode(j.at("e").get<std::string>());
    desired = etcd::base64_decode(j.at("d").get<std::string>());
  } catch (const std::exception&) {
    co_return;  // not one of ours
  }
  std::vector<Compare> cmp{cas_compare(key, expected)};
  std::vector<Op> ok{{Op::Kind::kPut, key, desired, 0}};
  co_await st.will_client.txn(std::move(cmp), std::move(ok), {}, st.op_deadline());
}

// The node a will belongs to: its "n" (the EtcdStore that wrote it, which keeps it across
// leases), else the whole value (a will written without one).
std::string node_of(const std::string& will) {
  try {
    auto j = nlohmann::json::parse(will);
    if (j.is_object() && j.contains("n") && j["n"].is_string())
      return "n:" + j["n"].get<std::string>();
  } catch (const std::exception&) {
  }
  return will;
}

// Whether a will's value holds a compare-and-set (a cleared will names only its node).
bool has_will(const std::string& will) {
  try {
    auto j = nlohmann::json::parse(will);
    return j.is_object() && j.contains("k");
  } catch (const std::exception&) {
    return false;
  }
}

// Whether this node's own lease is still alive, asked of etcd at once (a keep-alive: etcd
// answers an expired lease as gone even before it has revoked it). One that ended is noted
// (and the keeper woken to replace it); no answer within a lease TTL counts as ended too.
asio::awaitable<bool> own_lease_alive(EtcdStore::State& st) {
  bool alive = false;
  try {
    alive =
        co_await st.will_client.lease_keep_alive(st.lease, Clock::now() + st.opts.lease_ttl) > 0;
  } catch (const EtcdError& e) {
    if (e.kind() == EtcdError::Kind::kClosed) throw;
  }
  if (!alive) {
    st.lease_ended(Clock::now());
    st.keep_timer.cancel();
  }
  co_return alive;
}

// The will applier, for as long as the store is open: it knows the job's live wills (a read,
// then a watch of `will/`) and applies each one that disappears. After a lost or quiet watch
// it reads the live wills again: one known before and absent now ended in between. The first
// read is as of this client's first request, so no death after it is missed, and nothing
// depends on etcd's history beyond the current revision.
//
// A node's death or the store's absence: a will that disappears while this node's own lease
// is alive is a node that died while etcd was fine, applied at once. One that disappears
// while this node's own lease ended too (etcd answered nobody for longer than the TTL: every
// lease ended together) is held for grace(): each agent whose lease ended that way takes a
// new one and writes its will again, naming the same node, and only the wills whose node did
// not come back are applied.
asio::awaitable<void> apply_wills(std::shared_ptr<EtcdStore::State> st) {
  const std::string prefix = st->will_prefix();
  const std::string me = node_of(nlohmann::json{{"n", st->id}}.dump());
  std::map<std::string, std::string> known;  // live wills: key -> value
  struct Held {
    std::string will;
    Clock::time_point since;
  };
  std::map<std::string, Held> held;  // node -> its will, ended while etcd was away
  bool first = true;
  auto lives = [&](const std::string& node) {
    return std::any_of(known.begin(), known.end(),
                       [&](const auto& kv) { return node_of(kv.second) == node; });
  };
  auto ended = [&](const std::string& will) -> asio::awaitable<void> {
    if (!has_will(will)) co_return;  // cleared
    const std::string node = node_of(will);
    if (node == me) {
      // This node's own will: its lease ended without it (etcd was away). The keeper takes a
      // new lease and writes the will again at once.
      st->lease_ended(Clock::now());
      st->keep_timer.cancel();
      co_return;
    }
    const auto now = Clock::now();
    if (held.empty() && (!st->keeping || st->lease == 0 ||
                         (!st->own_lease_ended_lately(now) && co_await own_lease_alive(*st)))) {
      co_await apply_will(*st, will);  // a node died while etcd was fine: at once
      co_return;
    }
    if (held.empty()) {
      sys::log_line(
          "etcd was unreachable for longer than the lease TTL (the leases ended with it): not "
          "a node loss unless a node does not re-register within " +
          sys::seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(st->grace())));
    }
    held[node] = Held{will, now};
  };
  // Drops the held wills whose node wrote its will again, applies those whose grace is over.
  // The grace counts from when etcd answered this node again.
  auto settle = [&]() -> asio::awaitable<void> {
    if (held.empty()) co_return;
    bool lost = false;
    for (auto it = held.begin(); it != held.end();) {
      const auto now = Clock::now();
      const auto from = std::max(it->second.since, st->away_ended.value_or(it->second.since));
      if (lives(it->first)) {
        it = held.erase(it);
      } else if (now - from >= st->grace() && now - st->answered <= st->silent_after()) {
        sys::log_line(
            "a node whose etcd lease ended while etcd was unreachable did not "
            "re-register within " +
            sys::seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(st->grace())) +
            ": applying its will");
        lost = true;
        const std::string will = it->second.will;
        it = held.erase(it);
        co_await apply_will(*st, will);
      } else {
        ++it;
      }
    }
    if (held.empty() && !lost) {
      sys::log_line(
          "etcd was unreachable for longer than the lease TTL (the leases ended together): not "
          "a node loss; every node re-registered");
    }
  };
  // When the next held will's grace may be over.
  auto next_due = [&]() {
    auto due = Clock::time_point::max();
    for (const auto& [node, h] : held) {
      due = std::min(due, std::max(h.since, st->away_ended.value_or(h.since)) + st->grace());
    }
    return due;
  };
  while (!st->closed) {
    try {
      etcd::RangeOptions at;
      if (first) at.revision = st->will_rev;
      etcd::RangeResult r = co_await st->will_client.range(prefix, etcd::prefix_end(prefix),
                                                           Clock::now() + st->opts.op_timeout, at);
      const int64_t rev = first ? st->will_rev : r.revision;
      std::map<std::string, std::string> live;
      for (auto& kv : r.kvs) live.emplace(std::move(kv.key), std::move(kv.value));
      std::vector<std::string> gone;
      for (const auto& [key, will] : known) {
        if (!live.count(key)) gone.push_back(will);
      }
      known = std::move(live);
      for (const auto& will : gone) {
        co_await ended(will);  // applying twice is harmless
      }
      co_await settle();
      first = false;
      if (!st->will_watch) {
        st->will_watch = std::make_unique<etcd::EtcdWatch>(st->executor, st->opts.client);
      }
      co_await st->will_watch->start(prefix, etcd::prefix_end(prefix), rev + 1,
                                     Clock::now() + st->opts.op_timeout);
      for (;;) {
        // Quiet for a keep-alive interval: read again, in case the member stopped answering.
        // A held will's grace ending wakes it too.
        auto batch = co_await st->will_watch->next(
            std::min<Deadline>(Clock::now() + st->opts.quiet(), next_due()));
        if (!batch) break;
        for (auto& ev : *batch) {
          if (!ev.deleted) {
            known[ev.kv.key] = ev.kv.value;
          } else if (auto it = known.find(ev.kv.key); it != known.end()) {
            const std::string will = std::move(it->second);
            known.erase(it);
            co_await ended(will);
          }
        }
        co_await settle();
      }
    } catch (const EtcdError& e) {
      if (e.kind() == EtcdError::Kind::kClosed || st->closed) break;
      // Unavailable (or the first read's revision compacted away): read again.
      first = false;
    } catch (const std::exception&) {
      first = false;
    }
  }
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
