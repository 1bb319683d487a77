// The etcd link (store_link.hpp): etcd's v3 API (EtcdStore), the agent's lease carrying its
// last will and handed to its guardian.
#include <algorithm>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "agent/etcd/lease_revoke.hpp"
#include "agent/rendezvous/etcd_store.hpp"
#include "agent/rendezvous/prefix_store.hpp"
#include "agent/rendezvous/rendezvous.hpp"
#include "agent/rendezvous/store_link.hpp"
#include "store/client.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;

class EtcdLink final : public StoreLink {
 public:
  EtcdLink(asio::io_context& io, const RendezvousSettings& s, LeaseObserver observer)
      : io_(io), s_(s), observer_(std::move(observer)) {}

  // Two clients under the job's prefix (the protocol's, whose lease carries this agent's last
  // will, and the round watcher's), each checked against etcd before the first join, so a
  // wrong endpoint, certificate or permission is one clear line within read_timeout.
  asio::awaitable<Clients> connect(asio::cancellation_slot cancel) override {
    const std::string prefix = "/ddprun/" + s_.run_id + "/";
    EtcdStoreOptions o = options(prefix);
    EtcdStoreOptions watch_options = o;
    watch_options.apply_wills = false;  // the protocol's client applies them
    const etcd::Options client = o.client;
    o.on_lease = [observer = observer_, client](int64_t lease) {
      if (observer) observer(lease ? etcd::revoke_request(client, lease) : "");
    };
    std::unique_ptr<EtcdStore> main, watch, recoveries;
    std::string error;
    try {
      main = std::make_unique<EtcdStore>(io_.get_executor(), o);
      watch = std::make_unique<EtcdStore>(io_.get_executor(), watch_options);
      if (s_.in_process_recovery) {
        recoveries = std::make_unique<EtcdStore>(io_.get_executor(), watch_options);
      }
      auto probe = [](EtcdStore& client, std::string key) -> asio::awaitable<void> {
        std::vector<std::string> keys{std::move(key)};
        co_await client.check(keys);
      };
      for (EtcdStore* client : {main.get(), watch.get()}) {
        co_await asio::co_spawn(io_.get_executor(), probe(*client, prefix + "round"),
                                asio::bind_cancellation_slot(cancel, asio::use_awaitable));
      }
    } catch (const etcd::EtcdError& e) {
      error = e.what();
    } catch (const store::StoreError& e) {
      error = e.what();
    } catch (const boost::system::system_error&) {  // cancelled
      throw RendezvousError("rendezvous interrupted");
    }
    if (error.rfind("no etcd member answered", 0) == 0) {
      throw RendezvousError("cannot reach etcd within " + sys::seconds_text(s_.read_timeout) +
                            " (read_timeout): " + error);
    }
    if (!error.empty()) {
      throw RendezvousError(error.find("etcd at") != std::string::npos
                                ? error
                                : "etcd at " + endpoint() + ": " + error);
    }
    main_ = main.get();
    Clients clients{std::make_unique<PrefixStore>(std::move(main), prefix),
                    std::make_unique<PrefixStore>(std::move(watch), prefix), nullptr};
    if (recoveries)
      clients.recoveries = std::make_unique<PrefixStore>(std::move(recoveries), prefix);
    co_return clients;
  }

  std::string endpoint() const override { return etcd::endpoints_text(s_.etcd_members); }
  std::string gone_text() const override { return " is gone (its etcd lease ended)"; }

  // Revoking the lease ends the running round for the others at once (its will).
  asio::awaitable<void> leave(Millis limit) override {
    if (main_) co_await main_->end(limit);
  }

 private:
  EtcdStoreOptions options(const std::string& prefix) const {
    EtcdStoreOptions o;
    o.client.endpoints = s_.etcd_members;
    o.client.tls = s_.etcd_tls;
    o.client.cacert = s_.etcd_cacert;
    o.client.cert = s_.etcd_cert;
    o.client.key = s_.etcd_key;
    // One member gets at most half a lease TTL (1 to 5 s) before the next is tried: a stopped
    // member must not cost a lease.
    o.client.attempt_timeout = std::clamp<Millis>(
        std::min<Millis>(s_.read_timeout, s_.keep_alive_interval * s_.keep_alive_max_attempt / 2),
        std::chrono::seconds(1), std::chrono::seconds(5));
    o.client.keep_alive_interval = s_.keep_alive_interval;
    o.client.keep_alive_probes = s_.keep_alive_max_attempt;
    o.client.cursor = std::make_shared<size_t>(0);  // one agent's clients fail over together
    o.job_prefix = prefix;
    o.op_timeout = s_.read_timeout;
    o.lease_ttl = s_.keep_alive_interval * s_.keep_alive_max_attempt;
    o.keep_alive_every = s_.keep_alive_interval;
    return o;
  }

  asio::io_context& io_;
  const RendezvousSettings& s_;
  LeaseObserver observer_;
  EtcdStore* main_ = nullptr;  // inside the protocol's client: its lease
};

}  // namespace

std::unique_ptr<StoreLink> make_etcd_link(asio::io_context& io, const RendezvousSettings& s,
                                          LeaseObserver observer) {
  return std::make_unique<EtcdLink>(io, s, std::move(observer));
}

}  // namespace ddprun::agent
