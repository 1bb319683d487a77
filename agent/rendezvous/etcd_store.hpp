// EtcdStore: the rendezvous store interface over etcd's v3 API (etcd::EtcdClient), for
// --rdzv-backend=etcd. Every key of the job lives under one prefix (`job_prefix`,
// "/ddprun/<rdzv-id>/"), which PrefixStore adds in front of this store.
//
//   * counters: a counter is k's own value plus the number of +1 marks under "k/+/". add(k, 1)
//     writes a new mark (named after this operation, so a retry after a lost reply rewrites the
//     same one) and returns the counter as of the mark's create revision, a consistent read at
//     that revision: N nodes joining at once cost N writes, not N^2 compare-and-set retries.
//     add(k, 0) reads the counter. Any other delta is a compare-and-set loop on k's own value,
//     with a marker key against double counting. So read a counter with add(k, 0): get(k)
//     sees only its own value (RoundProtocol reads its counters with add).
//   * compare_set: one transaction on k's create revision ("" = absent) or value.
//   * check, multi_get, multi_set: one transaction each (at most 128 operations per
//     transaction, etcd's default limit; longer lists take several).
//   * wait(keys): read the keys at revision R; if some are missing, watch the range that holds
//     them from R + 1 and decide again on every event (nothing polls).
//   * the last will: the first set_will grants this client an etcd lease (TTL = keep-alive
//     interval x attempts) and keeps it alive every interval on a connection of its own; the
//     will is a key `<job_prefix>will/<lease>` bound to the lease, holding (key, expected,
//     desired) and the node ("n": this store's id, the same under every lease it takes).
//     When the lease ends (revoked by end() or by ddprun's guardian when the agent dies;
//     expired when its host vanished) etcd deletes that key. Every client made with
//     apply_wills knows the job's live wills (read as of its first operation, then watched)
//     and applies the compare-and-set of each that disappears; the first one wins. After a
//     lost or quiet watch it reads them again and applies those that vanished meanwhile. A
//     cleared will is the same key naming only the node.
//   * a node's death or etcd's absence: a will that disappears while this client's own lease
//     is alive (a keep-alive sent then is answered with a TTL) is a node that died, applied
//     at once. One that disappears while this node's own lease ended too (within grace() of
//     the keeper's "expired", of this node's own will disappearing, or of that keep-alive
//     answering "gone" or not at all within a TTL) ended because etcd answered nobody for
//     longer than the TTL: it is held for grace() (the lease TTL + 2 keep-alive intervals,
//     counted from when etcd answers this node again) and applied only if no will naming the
//     same node appears meanwhile (each agent takes a new lease and writes its will again
//     when its keep-alive is answered "gone").
//
// Outages: an operation retries across the members until `op_timeout` (read_timeout) and then
// throws StoreError(kConnect) naming the endpoints; a wait without a deadline never gives up (a
// running round's watcher waits out an etcd outage; the keep-alive connection logs when etcd
// stops and starts answering). A lease that expired anyway (an outage longer than its TTL) is
// replaced and the will written again (by the keeper; at once when the applier sees this
// node's own will deleted).
//
// Threads: one executor, one operation at a time, as RendezvousStore says.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "agent/etcd/etcd_client.hpp"
#include "agent/rendezvous/rendezvous_store.hpp"

namespace ddprun::agent {

struct EtcdStoreOptions {
  etcd::Options client;    // endpoints, TLS, per-attempt timeout, TCP keep-alive
  std::string job_prefix;  // every key this store is given starts with it
  std::chrono::milliseconds op_timeout{
      60000};                                  // one operation, every retry included (read_timeout)
  std::chrono::milliseconds lease_ttl{15000};  // keep_alive_interval x keep_alive_max_attempt
  std::chrono::milliseconds keep_alive_every{5000};
  // How long a watch may stay silent before the store reads again (a member that stopped
  // answers nothing but keeps its connections open).
  std::chrono::milliseconds quiet() const { return keep_alive_every; }
  // Called with the lease id when this client's lease is granted or replaced, and with 0 when
  // end() revoked it (ddprun's guardian revokes the current one if the agent dies).
  std::function<void(int64_t lease)> on_lease;
  // Apply the job's wills (one watch of `<job_prefix>will/` from this client's first
  // operation on). One client per agent is enough: the one that runs the protocol.
  bool apply_wills = true;
};

class EtcdStore final : public RendezvousStore {
 public:
  EtcdStore(boost::asio::any_io_executor executor, EtcdStoreOptions options);
  ~EtcdStore() override;

  awaitable<int64_t> add(std::string key, int64_t delta) override;
  awaitable<std::string> compare_set(std::string key, std::string expected,
                                     std::string desired) override;
  awaitable<bool> check(std::vector<std::string> keys) override;
  awaitable<bool> wait(std::vector<std::string> keys, Millis timeout) override;
  awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys) override;
  awaitable<void> multi_set(std::vector<std::pair<std::string, std::string>> kvs) override;
  awaitable<void> set_will(std::string key, std::string expected, std::string desired) override;
  // Stops at once: an operation in progress throws kClosed; the lease is left to expire (or to
  // the guardian).
  void close() override;

  // Revokes the lease (the will applies for the others within one event) and closes. Bounded by
  // `timeout`; without etcd the lease expires after its TTL instead.
  awaitable<void> end(Millis timeout);

  // For tests: stop keeping the lease alive without revoking it (a host that vanished).
  void abandon();
  int64_t lease() const;

  struct State;

 private:
  std::shared_ptr<State> st_;
};

}  // namespace ddprun::agent
