#include "agent/rendezvous/store_link.hpp"

namespace ddprun::agent {

std::unique_ptr<StoreLink> make_store_link(boost::asio::io_context& io,
                                           const RendezvousSettings& settings,
                                           LeaseObserver lease_observer) {
  if (settings.backend == Backend::kEtcd) {
    return make_etcd_link(io, settings, std::move(lease_observer));
  }
  return make_c10d_link(io, settings);  // c10d and static: our store
}

}  // namespace ddprun::agent
