#include "agent/rendezvous/make_rendezvous.hpp"

#include "agent/rendezvous/store_rendezvous.hpp"

namespace ddprun::agent {

std::unique_ptr<RendezvousHandler> make_rendezvous(
    boost::asio::io_context& io, const std::optional<RendezvousSettings>& multi_node,
    const LocalRendezvousOptions& local, LeaseObserver lease_observer) {
  if (multi_node) {
    return std::make_unique<StoreRendezvous>(io, *multi_node, std::move(lease_observer));
  }
  return std::make_unique<LocalRendezvous>(io, local);
}

}  // namespace ddprun::agent
