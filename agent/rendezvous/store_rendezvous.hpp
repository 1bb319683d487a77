// StoreRendezvous: the multi-node rendezvous (torchrun's c10d backend, the static backend with
// --node-rank, and etcd) over a store. The protocol is RoundProtocol (round_protocol.hpp); this
// class runs it on the agent's io_context, with no thread of its own:
//
//   * two clients of the rendezvous store (under the job's prefix), from its StoreLink
//     (store_link.hpp: our store, hosted here or elsewhere, or etcd): the main one runs the
//     protocol, the other parks in WAIT on the running round's "change" key (the round
//     watcher, a coroutine) and reports the event through round_end()/on_round_end();
//   * with --in-process-recovery, a third client parks in WAIT on the key of the round's next
//     process group generation (the generation watcher), so that a recovery another node
//     begins reaches this agent the moment it is claimed (on_peer_recovery);
//   * every round, this agent listens on a fresh workers' store (port 0) before joining; the
//     round's node-rank-0 agent keeps its own and the others close theirs, so workers get
//     MASTER_ADDR = that node's advertised address and MASTER_PORT = that fresh port.
//
// Both connections have TCP keep-alive (keep_alive_interval x keep_alive_max_attempt), on the
// store's side too, and the agent leaves a "last will" on its main connection: if it closes
// (the agent died, its host vanished), the store ends the running round with "dead:<id>" and
// the survivors re-form at once. The restart count and budget are the protocol's (the store's):
// this handler answers whether a restart is allowed.
//
// Threads: the io_context thread only.
#pragma once

#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "agent/rendezvous/rendezvous.hpp"
#include "agent/rendezvous/rendezvous_store.hpp"
#include "agent/rendezvous/round_protocol.hpp"
#include "agent/rendezvous/settings.hpp"
#include "agent/rendezvous/store_link.hpp"
#include "store/sys/wakeup.hpp"

namespace ddprun::store {
class Server;
class StoreProxy;
}  // namespace ddprun::store

namespace ddprun::agent {

class StoreRendezvous final : public RendezvousHandler {
 public:
  // `lease_observer` (etcd): see store_link.hpp.
  StoreRendezvous(boost::asio::io_context& io, RendezvousSettings settings,
                  LeaseObserver lease_observer = {});
  ~StoreRendezvous() override;

  const std::string& run_id() const override { return s_.run_id; }
  boost::asio::awaitable<RendezvousInfo> next_rendezvous(int local_world_size) override;
  std::optional<RoundEnd> round_end() const override { return round_end_; }
  void on_round_end(std::function<void()> callback) override { callback_ = std::move(callback); }
  boost::asio::awaitable<RoundEnd> report_failure(bool hang) override;
  boost::asio::awaitable<RoundEnd> report_success() override;
  boost::asio::awaitable<InPlaceRestart> restart_in_place(int generation) override;
  boost::asio::awaitable<void> share_generation(int generation, bool joined) override;
  boost::asio::awaitable<bool> generation_formed(int generation) override;
  void on_peer_recovery(std::function<void(const PeerRecovery&)> callback) override {
    peer_recovery_ = std::move(callback);
  }
  boost::asio::awaitable<std::vector<std::string>> exchange_hang_evidence(
      std::string mine, std::chrono::milliseconds timeout) override;
  void interrupt() override;
  void set_replica_port(int port) override { self_.replica_port = port; }
  bool spans_nodes() const override { return true; }
  boost::asio::awaitable<void> shutdown(Exit how) override;

 private:
  boost::asio::awaitable<void> connect();
  boost::asio::awaitable<void> watch_rounds();
  void on_change(int round, std::optional<std::string> value, std::string error);
  boost::asio::awaitable<void> watch_generations();
  void on_generation(int round, int generation, const std::string& value);
  int restarts_known() const;  // the formed round's restart count, recoveries in place included
  RoundEnd describe(const RoundChange& change) const;
  RoundEnd store_lost(const std::string& error) const;
  std::string endpoint() const;
  std::string node_name(const std::string& id) const;
  void host_workers_store();  // this node's workers' store for the next round (throws)
  void admit_members(const FormedRound& f);
  void log_round(const RendezvousInfo& info, int round, bool first, long long ms) const;
  void start_proxy(RendezvousInfo& info);
  boost::asio::awaitable<void> say_goodbye(Exit how);

  boost::asio::io_context& io_;
  RendezvousSettings s_;
  NodeDesc self_;
  std::unique_ptr<StoreLink> link_;              // how the store is reached (and maybe hosted)
  std::unique_ptr<RendezvousStore> main_;        // runs the protocol
  std::unique_ptr<RendezvousStore> watch_;       // parked in WAIT on the round's change key
  std::unique_ptr<RendezvousStore> recoveries_;  // parked in WAIT on the next generation's key
  std::unique_ptr<RoundProtocol> protocol_;
  std::unique_ptr<store::Server> workers_store_;  // this round's, on io_
  std::unique_ptr<store::StoreProxy> proxy_;      // --store-proxy: this round's, on io_
  std::optional<FormedRound> formed_;             // the round this node is a member of
  std::optional<RoundChange> last_change_;        // how formed_ ended
  std::optional<RoundEnd> round_end_;
  std::function<void()> callback_;
  std::function<void(const PeerRecovery&)> peer_recovery_;
  int in_place_restarts_ = 0;              // recoveries in place of the formed round known here
  bool watching_generations_ = false;      // the generation watcher runs
  boost::asio::steady_timer event_timer_;  // wakes report_success's wait
  sys::Wakeup watch_wake_;                 // a new round to watch, or shutdown
  std::optional<int> watch_round_;
  bool watching_ = false;  // the watcher coroutine runs
  bool stopping_ = false;
  bool interrupted_ = false;
  boost::asio::cancellation_signal connect_cancel_;  // ends a connect in progress
  bool store_broken_ = false;
};

}  // namespace ddprun::agent
