// The c10d link (store_link.hpp): our store, over store::AsyncClient, hosted in this agent when
// it is the endpoint's host.
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <optional>
#include <system_error>

#include "agent/rendezvous/c10d_store.hpp"
#include "agent/rendezvous/prefix_store.hpp"
#include "agent/rendezvous/rendezvous.hpp"
#include "agent/rendezvous/store_link.hpp"
#include "store/async_client.hpp"
#include "store/server.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"
#include "store/sys/port_holder.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;
using store::StoreError;

// Why the rendezvous store and this agent did not agree on the token (--rdzv-conf token_file).
std::string token_refusal(const std::string& endpoint, store::AuthFailure failure) {
  const std::string at = "the rendezvous store at " + endpoint;
  switch (failure) {
    case store::AuthFailure::kRefused:
      return at + " refused this agent's token (every node and the store need the same secret)";
    case store::AuthFailure::kServerUnproven:
      return at + " did not prove it knows the token (not this job's store, or another secret)";
    case store::AuthFailure::kServerOpen:
      return at + " does not ask for a token (started without --token-file?)";
    case store::AuthFailure::kTokenRequired:
      return at + " asks for a token: give this node --rdzv-conf token_file=PATH";
    case store::AuthFailure::kUnsupported:
    case store::AuthFailure::kNone:
      break;
  }
  return at + " does not support tokens (not a ddprun store, or an older one)";
}

class C10dLink final : public StoreLink {
 public:
  C10dLink(asio::io_context& io, const RendezvousSettings& s) : io_(io), s_(s) {}

  asio::awaitable<Clients> connect(asio::cancellation_slot cancel) override {
    host_store();
    store::ClientOptions opts;
    opts.connect_timeout = s_.join_timeout;
    opts.timeout = s_.read_timeout;
    opts.token = s_.token;
    const auto port = static_cast<uint16_t>(s_.endpoint_port);
    std::unique_ptr<store::AsyncClient> main, watch, recoveries;
    std::optional<StoreError> error;
    auto connect_one = [&]() {
      return asio::co_spawn(
          io_.get_executor(),
          store::AsyncClient::connect(io_.get_executor(), s_.endpoint_host, port, opts),
          asio::bind_cancellation_slot(cancel, asio::use_awaitable));
    };
    try {
      main = co_await connect_one();
      watch = co_await connect_one();
      co_await main->keep_alive(s_.keep_alive_interval, s_.keep_alive_max_attempt);
      co_await watch->keep_alive(s_.keep_alive_interval, s_.keep_alive_max_attempt);
      if (s_.in_process_recovery) {
        recoveries = co_await connect_one();
        co_await recoveries->keep_alive(s_.keep_alive_interval, s_.keep_alive_max_attempt);
      }
    } catch (const StoreError& e) {
      error = e;
    } catch (const boost::system::system_error&) {  // cancelled
      throw RendezvousError("rendezvous interrupted");
    }
    if (error && error->kind() == StoreError::Kind::kAuth) {
      throw RendezvousError(token_refusal(endpoint(), error->auth_failure()));
    }
    if (error && error->kind() == StoreError::Kind::kConnect) {
      throw RendezvousError("cannot reach the rendezvous store at " + endpoint() + " within " +
                            sys::seconds_text(s_.join_timeout) + " (" + s_.join_timeout_key +
                            "): " + error->what());
    }
    if (error) {
      throw RendezvousError("the rendezvous store at " + endpoint() +
                            " does not work as a ddprun store (" + error->what() +
                            "); point --rdzv-endpoint at a ddprun agent's or ddpstore's port");
    }
    const std::string prefix = "/ddprun/" + s_.run_id + "/";
    auto under_prefix = [&](std::unique_ptr<store::AsyncClient> client) {
      std::unique_ptr<RendezvousStore> out;
      if (client) {
        out = std::make_unique<PrefixStore>(std::make_unique<C10dStore>(std::move(client)), prefix);
      }
      return out;
    };
    co_return Clients{under_prefix(std::move(main)), under_prefix(std::move(watch)),
                      under_prefix(std::move(recoveries))};
  }

  std::string endpoint() const override {
    return sys::endpoint_text(s_.endpoint_host, s_.endpoint_port);
  }
  std::string gone_text() const override { return " is gone (its connection to the store closed)"; }
  bool hosts_store() const override { return host_ != nullptr; }

  asio::awaitable<void> leave(Millis) override {
    host_.reset();
    co_return;
  }

 private:
  // torchrun's is_host rule, or what --rdzv-conf is_host / static node 0 forces.
  void host_store() {
    if (!s_.is_host.value_or(sys::names_this_machine(s_.endpoint_host))) return;
    store::ServerOptions opts;
    opts.host = s_.bind_host;
    opts.port = static_cast<uint16_t>(s_.endpoint_port);
    opts.log_prefix = "[ddprun rendezvous store]";
    opts.token = s_.token;
    try {
      host_ = std::make_unique<store::ServerThread>(opts);
      const std::string where = sys::endpoint_text(s_.bind_host, host_->port());
      sys::log_line("hosting the rendezvous store of job '" + s_.run_id + "' on " + where);
      if (s_.token.empty() && !sys::is_loopback(s_.bind_host)) {
        sys::log_line("warning: the rendezvous store on " + where +
                      " accepts any client that reaches it; give every node --rdzv-conf "
                      "token_file=PATH (and ddpstore --token-file PATH)");
      }
    } catch (const std::system_error& e) {
      if (s_.is_host) {
        std::string holder = e.code() == std::errc::address_in_use
                                 ? sys::port_holder_text(s_.endpoint_port)
                                 : std::string();
        throw RendezvousError(
            std::string("cannot host the rendezvous store: ") + e.what() + holder +
            (s_.static_ranks ? "; is another job using --master-port " +
                                   std::to_string(s_.endpoint_port) + "? Choose another one"
                             : "; choose another port in --rdzv-endpoint"));
      }
      // torchrun's rule: the endpoint names this machine but another process (another agent
      // of this job on the same host, or a ddpstore) serves it: be its client.
    }
  }

  asio::io_context& io_;
  const RendezvousSettings& s_;
  std::unique_ptr<store::ServerThread> host_;  // the rendezvous store, when hosted here
};

}  // namespace

std::unique_ptr<StoreLink> make_c10d_link(asio::io_context& io, const RendezvousSettings& s) {
  return std::make_unique<C10dLink>(io, s);
}

}  // namespace ddprun::agent
