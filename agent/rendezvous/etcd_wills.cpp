#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <map>
#include <nlohmann/json.hpp>

#include "agent/rendezvous/etcd_store_state.hpp"
#include "store/sys/log.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent::etcd_store_detail {

namespace asio = boost::asio;
using etcd::Clock;
using etcd::Compare;
using etcd::Deadline;
using etcd::EtcdError;
using etcd::Op;

// --- the lease and this node's will ---

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

// --- the other nodes' wills ---

namespace {

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
class WillApplier {
 public:
  explicit WillApplier(std::shared_ptr<EtcdStore::State> st)
      : st_(std::move(st)),
        prefix_(st_->will_prefix()),
        me_(node_of(nlohmann::json{{"n", st_->id}}.dump())) {}

  asio::awaitable<void> run() {
    bool first = true;
    while (!st_->closed) {
      try {
        const int64_t rev = co_await read_live(first);
        first = false;
        co_await follow(rev);
      } catch (const EtcdError& e) {
        if (e.kind() == EtcdError::Kind::kClosed || st_->closed) break;
        // Unavailable (or the first read's revision compacted away): read again.
        first = false;
      } catch (const std::exception&) {
        first = false;
      }
    }
  }

 private:
  struct Held {
    std::string will;
    Clock::time_point since;
  };

  // Reads the live wills (the first time as of this client's first revision); those known
  // before and gone now ended in between. Returns the revision read.
  asio::awaitable<int64_t> read_live(bool first) {
    etcd::RangeOptions at;
    if (first) at.revision = st_->will_rev;
    etcd::RangeResult r = co_await st_->will_client.range(prefix_, etcd::prefix_end(prefix_),
                                                          Clock::now() + st_->opts.op_timeout, at);
    const int64_t rev = first ? st_->will_rev : r.revision;
    std::map<std::string, std::string> live;
    for (auto& kv : r.kvs) live.emplace(std::move(kv.key), std::move(kv.value));
    std::vector<std::string> gone;
    for (const auto& [key, will] : known_) {
      if (!live.count(key)) gone.push_back(will);
    }
    known_ = std::move(live);
    for (const auto& will : gone) {
      co_await ended(will);  // applying twice is harmless
    }
    co_await settle();
    co_return rev;
  }

  // Watches the wills from `rev` on, until the watch ends or is quiet for a keep-alive
  // interval (the member may have stopped answering); a held will's grace ending wakes it too.
  asio::awaitable<void> follow(int64_t rev) {
    if (!st_->will_watch) {
      st_->will_watch = std::make_unique<etcd::EtcdWatch>(st_->executor, st_->opts.client);
    }
    co_await st_->will_watch->start(prefix_, etcd::prefix_end(prefix_), rev + 1,
                                    Clock::now() + st_->opts.op_timeout);
    for (;;) {
      auto batch = co_await st_->will_watch->next(
          std::min<Deadline>(Clock::now() + st_->opts.quiet(), next_due()));
      if (!batch) co_return;
      for (auto& ev : *batch) {
        if (!ev.deleted) {
          known_[ev.kv.key] = ev.kv.value;
        } else if (auto it = known_.find(ev.kv.key); it != known_.end()) {
          const std::string will = std::move(it->second);
          known_.erase(it);
          co_await ended(will);
        }
      }
      co_await settle();
    }
  }

  bool lives(const std::string& node) const {
    return std::any_of(known_.begin(), known_.end(),
                       [&](const auto& kv) { return node_of(kv.second) == node; });
  }

  // A will that disappeared: applied at once, or held while etcd's absence explains it.
  asio::awaitable<void> ended(const std::string& will) {
    if (!has_will(will)) co_return;  // cleared
    const std::string node = node_of(will);
    if (node == me_) {
      // This node's own will: its lease ended without it (etcd was away). The keeper takes a
      // new lease and writes the will again at once.
      st_->lease_ended(Clock::now());
      st_->keep_timer.cancel();
      co_return;
    }
    const auto now = Clock::now();
    if (held_.empty() && (!st_->keeping || st_->lease == 0 ||
                          (!st_->own_lease_ended_lately(now) && co_await own_lease_alive(*st_)))) {
      co_await apply_will(*st_, will);  // a node died while etcd was fine: at once
      co_return;
    }
    if (held_.empty()) {
      sys::log_line(
          "etcd was unreachable for longer than the lease TTL (the leases ended with it): not "
          "a node loss unless a node does not re-register within " +
          sys::seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(st_->grace())));
    }
    held_[node] = Held{will, now};
  }

  // Drops the held wills whose node wrote its will again, applies those whose grace is over.
  // The grace counts from when etcd answered this node again.
  asio::awaitable<void> settle() {
    if (held_.empty()) co_return;
    bool lost = false;
    for (auto it = held_.begin(); it != held_.end();) {
      const auto now = Clock::now();
      const auto from = std::max(it->second.since, st_->away_ended.value_or(it->second.since));
      if (lives(it->first)) {
        it = held_.erase(it);
      } else if (now - from >= st_->grace() && now - st_->answered <= st_->silent_after()) {
        sys::log_line(
            "a node whose etcd lease ended while etcd was unreachable did not "
            "re-register within " +
            sys::seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(st_->grace())) +
            ": applying its will");
        lost = true;
        const std::string will = it->second.will;
        it = held_.erase(it);
        co_await apply_will(*st_, will);
      } else {
        ++it;
      }
    }
    if (held_.empty() && !lost) {
      sys::log_line(
          "etcd was unreachable for longer than the lease TTL (the leases ended together): not "
          "a node loss; every node re-registered");
    }
  }

  // When the next held will's grace may be over.
  Clock::time_point next_due() const {
    auto due = Clock::time_point::max();
    for (const auto& [node, h] : held_) {
      due = std::min(due, std::max(h.since, st_->away_ended.value_or(h.since)) + st_->grace());
    }
    return due;
  }

  std::shared_ptr<EtcdStore::State> st_;
  const std::string prefix_;
  const std::string me_;
  std::map<std::string, std::string> known_;  // live wills: key -> value
  std::map<std::string, Held> held_;          // node -> its will, ended while etcd was away
};

}  // namespace

asio::awaitable<void> apply_wills(std::shared_ptr<EtcdStore::State> st) {
  WillApplier applier(std::move(st));
  co_await applier.run();
}

}  // namespace ddprun::agent::etcd_store_detail
