// EtcdStore's state, shared by its two halves: the store's operations (etcd_store.cpp) and the
// lease with this node's will and the applier of the other nodes' wills (etcd_wills.cpp).
// Private to agent/rendezvous.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "agent/rendezvous/etcd_store.hpp"
#include "store/sys/log.hpp"
#include "store/sys/random.hpp"

namespace ddprun::agent {

namespace etcd_store_detail {

inline std::string hex(int64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
  return buf;
}

// compare_set's condition: "" = the key is absent (its create revision is 0), else its value.
inline etcd::Compare cas_compare(const std::string& key, const std::string& expected) {
  using etcd::Compare;
  return expected.empty() ? Compare{Compare::Target::kCreate, key, 0, {}}
                          : Compare{Compare::Target::kValue, key, 0, expected};
}

}  // namespace etcd_store_detail

struct EtcdStore::State : std::enable_shared_from_this<EtcdStore::State> {
  State(boost::asio::any_io_executor ex, EtcdStoreOptions o)
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

  etcd::Deadline op_deadline() const { return etcd::Clock::now() + opts.op_timeout; }
  // How long a will that ended with etcd's absence waits for its node to write it again: a
  // lease TTL and two keep-alive intervals from when etcd answers again (the node learns that
  // its lease ended on its first keep-alive after that, within an interval and one attempt,
  // then takes a new lease and writes its will: two requests).
  etcd::Clock::duration grace() const { return opts.lease_ttl + 2 * opts.keep_alive_every; }
  // Whether this node's own lease ended lately (within a grace) while this node was alive:
  // etcd did not answer it for longer than the TTL.
  bool own_lease_ended_lately(etcd::Clock::time_point now) const {
    return own_lease_ended && now - *own_lease_ended < grace();
  }
  // A silence of the keeper this long means etcd is not answering this node now.
  etcd::Clock::duration silent_after() const { return opts.keep_alive_every * 3 / 2; }
  // The keeper heard from etcd (any answer about the lease).
  void answer(etcd::Clock::time_point now) {
    if (answered != etcd::Clock::time_point() && now - answered > silent_after()) away_ended = now;
    answered = now;
  }
  void lease_ended(etcd::Clock::time_point now) { own_lease_ended = now; }
  std::string will_key() const { return opts.job_prefix + "will/" + etcd_store_detail::hex(lease); }
  std::string will_prefix() const { return opts.job_prefix + "will/"; }

  // The first revision this client saw: wills are applied from there on.
  void seen(int64_t revision);

  boost::asio::any_io_executor executor;
  EtcdStoreOptions opts;
  etcd::EtcdClient client;                      // the operations
  etcd::EtcdClient keeper;                      // the lease's keep-alives
  etcd::EtcdClient will_client;                 // the will applier's compare-and-sets
  std::unique_ptr<etcd::EtcdWatch> watch;       // wait()'s
  std::unique_ptr<etcd::EtcdWatch> will_watch;  // the will applier's
  boost::asio::steady_timer keep_timer;
  std::string id;  // names this client's operation markers
  int64_t op_seq = 0;
  int64_t lease = 0;
  std::string will_value;  // "" = none yet; a cleared will names only the node
  int64_t will_rev = 0;    // this client's first revision: wills are applied from there on
  int64_t will_lease = 0;  // the lease will_value was last written with
  bool applying = false;   // the will applier runs
  bool keeping = false;
  etcd::Clock::time_point answered;                   // the keeper's last answer from etcd
  std::optional<etcd::Clock::time_point> away_ended;  // etcd answered the keeper after a silence
  std::optional<etcd::Clock::time_point> own_lease_ended;  // seen ended while this node was alive
  bool closed = false;
};

namespace etcd_store_detail {

// A fresh lease of the store's TTL, through `client`, made this client's (and the guardian's).
boost::asio::awaitable<void> new_lease(EtcdStore::State& st, etcd::EtcdClient& client);
// Writes the will under the current lease, until what was written is the current will under
// the current lease (set_will and the keeper may both write it; the last word is the latest).
boost::asio::awaitable<void> write_will(EtcdStore::State& st, etcd::EtcdClient& client);
// Keeps the lease alive every keep_alive_every until the store closes; replaces a lease that
// expired anyway (etcd unreachable for longer than its TTL) and writes the will again.
boost::asio::awaitable<void> keep_lease(std::shared_ptr<EtcdStore::State> st);
// The will applier, for as long as the store is open (etcd_wills.cpp).
boost::asio::awaitable<void> apply_wills(std::shared_ptr<EtcdStore::State> st);

}  // namespace etcd_store_detail

}  // namespace ddprun::agent
