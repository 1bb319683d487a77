// How the store-backed rendezvous (store_rendezvous.hpp) reaches its store. The round protocol
// is the same on every store; what differs is behind this interface, one implementation per
// kind of store, so StoreRendezvous has no backend branches:
//   - c10d (also the static backend): our store, hosted by this agent when it is the endpoint's
//     host (static node 0; torchrun's is_host rule), else another agent's or a ddpstore;
//   - etcd: etcd's v3 API; the agent's lease carries its last will.
// make_store_link() picks one from RendezvousSettings::backend.
//
// Threads: the io_context thread only.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <string>

#include "agent/rendezvous/rendezvous_store.hpp"
#include "agent/rendezvous/settings.hpp"

namespace ddprun::agent {

class StoreLink {
 public:
  // The clients of a store-backed rendezvous, all under the job's prefix: `main` runs the
  // protocol and carries this agent's last will, `watch` parks on the round's change key, and
  // with --in-process-recovery (settings.in_process_recovery) `recoveries` parks on the key of
  // the round's next process group generation.
  struct Clients {
    std::unique_ptr<RendezvousStore> main;
    std::unique_ptr<RendezvousStore> watch;
    std::unique_ptr<RendezvousStore> recoveries;
  };

  virtual ~StoreLink() = default;

  // Hosts the store when this agent should, then connects and checks the clients. A signal
  // on `cancel` (the handler's interrupt()) ends it at once. Throws RendezvousError: one line
  // that says what is wrong (unreachable, a token refused, not a ddprun store...).
  virtual boost::asio::awaitable<Clients> connect(boost::asio::cancellation_slot cancel) = 0;
  // "node0:29400", or etcd's members: for messages.
  virtual std::string endpoint() const = 0;
  // How a node's will reads once it fired: " is gone (its connection to the store closed)".
  virtual std::string gone_text() const = 0;
  // Whether this agent serves the store (then it leaves last, after the others' goodbyes).
  virtual bool hosts_store() const { return false; }
  // Leaving: ends this agent's presence at once for the others (etcd: revokes the lease),
  // within `limit`. Then stops serving the store, when it did.
  virtual boost::asio::awaitable<void> leave(Millis limit) = 0;
};

// etcd: `lease_observer` is called with what revokes this agent's lease (etcd::revoke_request)
// whenever it changes, and with "" once the agent revoked it itself (see guardian.hpp).
using LeaseObserver = std::function<void(const std::string& revoke_request)>;

// `settings` must outlive the link.
std::unique_ptr<StoreLink> make_store_link(boost::asio::io_context& io,
                                           const RendezvousSettings& settings,
                                           LeaseObserver lease_observer);

// The two kinds (c10d_link.cpp, etcd_link.cpp); make_store_link() picks.
std::unique_ptr<StoreLink> make_c10d_link(boost::asio::io_context& io,
                                          const RendezvousSettings& settings);
std::unique_ptr<StoreLink> make_etcd_link(boost::asio::io_context& io,
                                          const RendezvousSettings& settings,
                                          LeaseObserver lease_observer);

}  // namespace ddprun::agent
