#include "agent/rendezvous/local_rendezvous.hpp"

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <system_error>
#include <utility>

#include "agent/rendezvous/workers_store_peers.hpp"
#include "store/server.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"
#include "store/sys/port_holder.hpp"

namespace ddprun::agent {

LocalRendezvous::LocalRendezvous(boost::asio::io_context& io, LocalRendezvousOptions options)
    : io_(io), options_(std::move(options)) {}

LocalRendezvous::~LocalRendezvous() = default;

boost::asio::awaitable<RendezvousInfo> LocalRendezvous::next_rendezvous(int local_world_size) {
  if (std::exchange(restart_next_, false)) ++restart_count_;
  const int restart_count = restart_count_;
  // Fresh state for this attempt: drop the previous store (and its connections) first, so a
  // fixed port can be bound again.
  server_.reset();
  store::ServerOptions opts;
  opts.host = options_.bind_host;
  opts.port = static_cast<uint16_t>(options_.port);
  // On a restart with a fixed port, the port was free a moment ago; if an outgoing
  // connection happened to pick it as its ephemeral port meanwhile, give it a moment.
  const int tries = restart_count > 0 && options_.port != 0 ? 20 : 1;
  for (int attempt = 1;; ++attempt) {
    try {
      server_ = std::make_unique<store::Server>(io_, opts);
      // On the wildcard only because the user named a host: still a one-node job's store.
      if (sys::is_wildcard(opts.host)) {
        server_->set_allowed_peers(this_machine_peers(), "not this machine (a one-node job)");
      }
      break;
    } catch (const std::system_error& e) {
      if (attempt >= tries) {
        std::string hint =
            options_.port != 0
                ? (e.code() == std::errc::address_in_use ? sys::port_holder_text(options_.port)
                                                         : std::string()) +
                      "; choose another --master-port, or leave it out (a "
                      "one-node job then takes a free port)"
                : "";
        throw RendezvousError(std::string("cannot host the store: ") + e.what() + hint);
      }
    }
    boost::asio::steady_timer timer(io_, std::chrono::milliseconds(50));
    co_await timer.async_wait(boost::asio::use_awaitable);
  }
  RendezvousInfo info;
  info.round = restart_count;
  info.group_rank = 0;
  info.group_world_size = 1;
  info.base_global_rank = 0;
  info.world_size = local_world_size;
  info.master_addr = options_.master_addr;
  info.master_port = server_->port();
  info.use_agent_store = true;
  info.store_host = options_.master_addr;
  info.store_port = server_->port();
  info.restart_count = restart_count;
  info.max_restarts = options_.max_restarts;
  info.members = {sys::host_name()};
  co_return info;
}

boost::asio::awaitable<RoundEnd> LocalRendezvous::report_failure(bool hang) {
  RoundEnd end;
  end.kind = RoundEnd::Kind::kWorkerFailed;
  end.hang = hang;
  end.restart_allowed = may_restart(restart_count_, options_.max_restarts);
  restart_next_ = end.restart_allowed;
  co_return end;
}

boost::asio::awaitable<RendezvousHandler::InPlaceRestart> LocalRendezvous::restart_in_place(int) {
  if (!may_restart(restart_count_, options_.max_restarts)) co_return InPlaceRestart{};
  co_return InPlaceRestart{++restart_count_, {}};
}

boost::asio::awaitable<void> LocalRendezvous::shutdown(Exit) {
  server_.reset();
  co_return;
}

}  // namespace ddprun::agent
