// The rendezvous a launch asks for: its one node alone (LocalRendezvous), or several nodes
// agreeing through a store (StoreRendezvous, on the store its backend names: store_link.hpp).
// The one place that chooses; everything after works on a RendezvousHandler.
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>
#include <optional>

#include "agent/rendezvous/local_rendezvous.hpp"
#include "agent/rendezvous/rendezvous.hpp"
#include "agent/rendezvous/settings.hpp"
#include "agent/rendezvous/store_link.hpp"

namespace ddprun::agent {

// `multi_node` set: the store-backed rendezvous with those settings (`lease_observer`: etcd's,
// see store_link.hpp); else the single-node one with `local`.
std::unique_ptr<RendezvousHandler> make_rendezvous(
    boost::asio::io_context& io, const std::optional<RendezvousSettings>& multi_node,
    const LocalRendezvousOptions& local, LeaseObserver lease_observer);

}  // namespace ddprun::agent
