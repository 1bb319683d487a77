#include "agent/rendezvous/store_rendezvous.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <system_error>

#include "agent/etcd/lease_revoke.hpp"
#include "agent/rendezvous/c10d_store.hpp"
#include "agent/rendezvous/etcd_store.hpp"
#include "agent/rendezvous/prefix_store.hpp"
#include "agent/rendezvous/workers_store_peers.hpp"
#include "store/server.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"
#include "store/sys/random.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using store::StoreError;

namespace {

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

}  // namespace

StoreRendezvous::StoreRendezvous(asio::io_context& io, RendezvousSettings settings)
    : io_(io), s_(std::move(settings)), event_timer_(io), watch_wake_(io.get_executor()) {
  self_.addr = s_.local_addr.empty() ? sys::fq_host_name() : s_.local_addr;
  self_.id = self_.addr + ":" + std::to_string(::getpid()) + ":" + sys::random_hex(3);
  self_.hint = s_.node_rank_hint;
}

StoreRendezvous::~StoreRendezvous() = default;

std::string StoreRendezvous::endpoint() const {
  if (s_.backend == Backend::kEtcd) return etcd::endpoints_text(s_.etcd_members);
  return sys::endpoint_text(s_.endpoint_host, s_.endpoint_port);
}

void StoreRendezvous::host_store() {
  bool want = s_.is_host.value_or(sys::names_this_machine(s_.endpoint_host));
  if (!want) return;
  store::ServerOptions opts;
  opts.host = s_.bind_host;
  opts.port = static_cast<uint16_t>(s_.endpoint_port);
  opts.log_prefix = "[ddprun rendezvous store]";
  opts.token = s_.token;
  try {
    host_ = std::make_unique<store::ServerThread>(opts);
    sys::log_line("hosting the rendezvous store of job '" + s_.run_id + "' on " +
                  sys::endpoint_text(s_.bind_host, host_->port()));
    if (s_.token.empty() && !sys::is_loopback(s_.bind_host)) {
      sys::log_line("warning: the rendezvous store on " +
                    sys::endpoint_text(s_.bind_host, host_->port()) +
                    " accepts any client that reaches it; give every node --rdzv-conf "
                    "token_file=PATH (and ddpstore --token-file PATH)");
    }
  } catch (const std::system_error& e) {
    if (s_.is_host) {
      throw RendezvousError(
          std::string("cannot host the rendezvous store: ") + e.what() +
          (s_.backend == Backend::kStatic
               ? " (is another job using --master-port " + std::to_string(s_.endpoint_port) + "?)"
               : ""));
    }
    // torchrun's rule: the endpoint names this machine but another process (another agent
    // of this job on the same host, or a ddpstore) serves it: be its client.
  }
}

// etcd: two clients under the job's prefix (the protocol's, whose lease carries this agent's
// last will, and the round watcher's), each checked against etcd before the first join, so a
// wrong endpoint, certificate or permission is one clear line within read_timeout.
asio::awaitable<void> StoreRendezvous::connect_etcd() {
  const std::string prefix = "/ddprun/" + s_.run_id + "/";
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
  EtcdStoreOptions watch_options = o;
  watch_options.apply_wills = false;  // the protocol's client applies them
  const etcd::Options client = o.client;
  o.on_lease = [this, client](int64_t lease) {
    if (lease_observer_) lease_observer_(lease ? etcd::revoke_request(client, lease) : "");
  };
  std::unique_ptr<EtcdStore> main, watch;
  std::string error;
  try {
    if (interrupted_) throw RendezvousError("rendezvous interrupted");
    main = std::make_unique<EtcdStore>(io_.get_executor(), o);
    watch = std::make_unique<EtcdStore>(io_.get_executor(), watch_options);
    auto probe = [](EtcdStore& store, std::string key) -> asio::awaitable<void> {
      std::vector<std::string> keys{std::move(key)};
      co_await store.check(keys);
    };
    // Cancelled by interrupt(): a signal must not wait while no member answers.
    for (EtcdStore* store : {main.get(), watch.get()}) {
      co_await asio::co_spawn(
          io_.get_executor(), probe(*store, prefix + "round"),
          asio::bind_cancellation_slot(connect_cancel_.slot(), asio::use_awaitable));
    }
  } catch (const etcd::EtcdError& e) {
    error = e.what();
  } catch (const store::StoreError& e) {
    error = e.what();
  } catch (const boost::system::system_error& e) {  // cancelled
    error = e.what();
  }
  if (!error.empty()) {
    if (interrupted_) throw RendezvousError("rendezvous interrupted");
    if (error.rfind("no etcd member answered", 0) == 0) {
      throw RendezvousError("cannot reach etcd within " + sys::seconds_text(s_.read_timeout) +
                            " (read_timeout): " + error);
    }
    throw RendezvousError(error.find("etcd at") != std::string::npos
                              ? error
                              : "etcd at " + endpoint() + ": " + error);
  }
  etcd_main_ = main.get();
  main_ = std::make_unique<PrefixStore>(std::move(main), prefix);
  watch_ = std::make_unique<PrefixStore>(std::move(watch), prefix);
  protocol_ = std::make_unique<RoundProtocol>(*main_, s_, self_);
  watching_ = true;
  asio::co_spawn(io_, watch_rounds(), asio::detached);
}

asio::awaitable<void> StoreRendezvous::connect() {
  if (s_.backend == Backend::kEtcd) {
    co_await connect_etcd();
    co_return;
  }
  host_store();
  store::ClientOptions opts;
  opts.connect_timeout = s_.join_timeout;
  opts.timeout = s_.read_timeout;
  opts.token = s_.token;
  const auto port = static_cast<uint16_t>(s_.endpoint_port);
  std::unique_ptr<store::AsyncClient> main, watch;
  std::optional<store::StoreError> error;
  // Cancelled by interrupt(): a signal must not wait for join_timeout while nobody answers.
  auto connect_one = [&]() {
    return asio::co_spawn(
        io_.get_executor(),
        store::AsyncClient::connect(io_.get_executor(), s_.endpoint_host, port, opts),
        asio::bind_cancellation_slot(connect_cancel_.slot(), asio::use_awaitable));
  };
  try {
    if (interrupted_) throw RendezvousError("rendezvous interrupted");
    main = co_await connect_one();
    watch = co_await connect_one();
    co_await main->keep_alive(s_.keep_alive_interval, s_.keep_alive_max_attempt);
    co_await watch->keep_alive(s_.keep_alive_interval, s_.keep_alive_max_attempt);
  } catch (const store::StoreError& e) {
    error = e;
  } catch (const boost::system::system_error& e) {  // cancelled by interrupt()
    if (!interrupted_) throw;
  }
  if (interrupted_) throw RendezvousError("rendezvous interrupted");
  if (error && error->kind() == store::StoreError::Kind::kAuth) {
    throw RendezvousError(token_refusal(endpoint(), error->auth_failure()));
  }
  if (error && error->kind() == store::StoreError::Kind::kConnect) {
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
  main_ = std::make_unique<PrefixStore>(std::make_unique<C10dStore>(std::move(main)), prefix);
  watch_ = std::make_unique<PrefixStore>(std::make_unique<C10dStore>(std::move(watch)), prefix);
  protocol_ = std::make_unique<RoundProtocol>(*main_, s_, self_);
  watching_ = true;
  asio::co_spawn(io_, watch_rounds(), asio::detached);
}

namespace {

// This node's place in a formed round: what the agent and its workers are told.
RendezvousInfo info_for(const FormedRound& f, int max_restarts) {
  const int me = f.index;
  const int rank0 = f.ranks.rank0_index;
  RendezvousInfo info;
  info.round = f.round;
  info.group_rank = f.ranks.node_rank[me];
  info.group_world_size = static_cast<int>(f.nodes.size());
  info.base_global_rank = f.ranks.base_rank[me];
  info.world_size = f.ranks.world_size;
  info.master_addr = f.nodes[rank0].addr;
  info.master_port = f.nodes[rank0].port;
  info.use_agent_store = true;
  info.store_host = info.master_addr;
  info.store_port = info.master_port;
  info.restart_count = f.restart_count;
  info.max_restarts = max_restarts;
  info.members.resize(f.nodes.size());
  for (size_t i = 0; i < f.nodes.size(); ++i) info.members[f.ranks.node_rank[i]] = f.nodes[i].addr;
  return info;
}

}  // namespace

asio::awaitable<RendezvousInfo> StoreRendezvous::next_rendezvous(int local_world_size) {
  if (store_broken_) throw RendezvousError("lost the rendezvous store at " + endpoint());
  if (!protocol_) co_await connect();
  // This node's workers' store for the round, ready before anyone can pick it as rank 0.
  workers_store_.reset();
  try {
    store::ServerOptions opts;
    opts.host = s_.workers_bind_host;
    opts.port = 0;
    opts.log_prefix = "[ddprun workers' store]";
    workers_store_ = std::make_unique<store::Server>(io_, opts);
    // No round yet: local clients only (the members are let in once the round forms).
    workers_store_->set_allowed_peers(loopback_peers(), "not a member of a formed round");
  } catch (const std::system_error& e) {
    throw RendezvousError(std::string("cannot host the workers' store: ") + e.what());
  }
  self_.nproc = local_world_size;
  self_.port = workers_store_->port();
  protocol_->set_self(self_);
  const bool first = !formed_;
  const auto started = Clock::now();
  FormedRound f;
  try {
    f = co_await protocol_->join(formed_, last_change_);
  } catch (const JobClosed& e) {
    // A member of the finished job leaves with success; a late node did nothing: 1.
    throw RendezvousError(e.what(), formed_ && e.succeeded() ? 0 : 1);
  } catch (const RendezvousFailed& e) {
    throw RendezvousError(e.what());
  } catch (const store::StoreError& e) {
    if (interrupted_) throw RendezvousError("rendezvous interrupted");
    store_broken_ = true;
    throw RendezvousError("lost the rendezvous store at " + endpoint() + ": " + e.what());
  }
  formed_ = f;
  last_change_.reset();
  round_end_.reset();
  if (f.ranks.rank0_index != f.index) {
    workers_store_.reset();
  } else {
    admit_members(f);
  }
  watch_round_ = f.round;
  watch_wake_.notify();

  RendezvousInfo info = info_for(f, protocol_->max_restarts());
  auto ms = std::chrono::duration_cast<Millis>(Clock::now() - started).count();
  sys::log_line("rendezvous round " + std::to_string(f.round) + " of job '" + s_.run_id + "' (" +
                std::string(backend_name(s_.backend)) + ", " + endpoint() + ") " +
                (first ? "formed" : "re-formed") + " in " + std::to_string(ms) + " ms: node rank " +
                std::to_string(info.group_rank) + " of " + std::to_string(info.group_world_size) +
                " nodes, world size " + std::to_string(info.world_size) + ", master " +
                sys::endpoint_text(info.master_addr, info.master_port) + ", restart count " +
                std::to_string(info.restart_count) + " of " + std::to_string(info.max_restarts));
  co_return info;
}

// Before any worker starts: the workers' store takes connections from loopback and from the
// round's members only (torch's clients cannot authenticate; their addresses can be checked).
void StoreRendezvous::admit_members(const FormedRound& f) {
  std::vector<std::string> members, unresolved;
  for (const NodeDesc& node : f.nodes) members.push_back(node.addr);
  workers_store_->set_allowed_peers(member_peers(members, &unresolved),
                                    "not a member of round " + std::to_string(f.round));
  for (const std::string& name : unresolved) {
    sys::log_line("warning: cannot resolve member " + name +
                  ": the workers' store will refuse its workers");
  }
}

std::string StoreRendezvous::node_name(const std::string& id) const {
  if (formed_) {
    for (size_t i = 0; i < formed_->nodes.size(); ++i) {
      if (formed_->nodes[i].id == id) {
        return "node " + std::to_string(formed_->ranks.node_rank[i]) + " (" +
               formed_->nodes[i].addr + ")";
      }
    }
  }
  return "node " + id;
}

RoundEnd StoreRendezvous::describe(const RoundChange& c) const {
  RoundEnd e;
  switch (c.kind) {
    case RoundChange::Kind::kDone:
      e.kind = RoundEnd::Kind::kSucceeded;
      e.what = "every node's workers exited 0";
      break;
    case RoundChange::Kind::kFail:
      e.kind = RoundEnd::Kind::kWorkerFailed;
      e.restart_allowed = formed_ && formed_->restart_count < protocol_->max_restarts();
      e.what = node_name(c.node_id) + " reported a failed worker";
      break;
    case RoundChange::Kind::kJoin:
      e.kind = RoundEnd::Kind::kNodeJoined;
      e.what = "a new node (" + c.node_id + ") is waiting to join";
      break;
    case RoundChange::Kind::kDead:
      e.kind = RoundEnd::Kind::kNodeLost;
      e.what = node_name(c.node_id) + (s_.backend == Backend::kEtcd
                                           ? " is gone (its etcd lease ended)"
                                           : " is gone (its connection to the store closed)");
      break;
  }
  return e;
}

RoundEnd StoreRendezvous::store_lost(const std::string& error) const {
  return RoundEnd{RoundEnd::Kind::kStoreLost,
                  "lost the rendezvous store at " + endpoint() + ": " + error, false};
}

// The round watcher: one WAIT per round on the watch connection, so any event that ends the
// round (a node joined, died or failed, or all finished) reaches this agent the moment it is
// written. Losing that connection means losing the store, which is reported the same way.
asio::awaitable<void> StoreRendezvous::watch_rounds() {
  for (;;) {
    while (!watch_round_ && !stopping_) co_await watch_wake_.wait();
    if (stopping_) break;
    const int round = *std::exchange(watch_round_, std::nullopt);
    std::optional<std::string> value;
    std::string error;
    try {
      const std::string key = RoundProtocol::key(round, "change");
      std::vector<std::string> keys{key};
      co_await watch_->wait(std::move(keys), Millis(0));  // TCP keep-alive notices a dead store
      value = co_await watch_->get(key, Millis(0));
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (stopping_) break;
    on_change(round, std::move(value), std::move(error));
    if (!value) break;  // the connection is gone
  }
  watching_ = false;
}

void StoreRendezvous::on_change(int round, std::optional<std::string> value, std::string error) {
  if (!formed_ || round != formed_->round || round_end_) return;
  if (!value) {
    store_broken_ = true;
    round_end_ = store_lost(error);
  } else {
    try {
      last_change_ = RoundChange::parse(*value);
      round_end_ = describe(*last_change_);
    } catch (const RendezvousFailed& e) {
      store_broken_ = true;
      round_end_ = store_lost(e.what());
    }
  }
  event_timer_.cancel();
  if (callback_) callback_();
}

asio::awaitable<RoundEnd> StoreRendezvous::report_failure() {
  if (round_end_) co_return *round_end_;
  const int round = formed_->round;
  const std::string value = "fail:" + self_.id;
  try {
    RoundChange c = co_await protocol_->end_round(round, value);
    if (!round_end_) {
      last_change_ = c;
      round_end_ = describe(c);
    }
  } catch (const std::exception& e) {
    if (!round_end_) {
      store_broken_ = true;
      round_end_ = store_lost(e.what());
    }
  }
  co_return *round_end_;
}

asio::awaitable<RoundEnd> StoreRendezvous::report_success() {
  if (!round_end_) {
    try {
      co_await protocol_->report_success(*formed_);
    } catch (const std::exception& e) {
      if (!round_end_) {
        store_broken_ = true;
        round_end_ = store_lost(e.what());
      }
    }
  }
  const auto deadline = Clock::now() + s_.exit_barrier_timeout;
  while (!round_end_ && !interrupted_ && Clock::now() < deadline) {
    event_timer_.expires_at(deadline);
    boost::system::error_code ec;
    co_await event_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  if (!round_end_) {
    if (!interrupted_) {
      sys::log_line("exit barrier: not every node finished within " +
                    sys::seconds_text(s_.exit_barrier_timeout) + "; leaving");
    }
    co_return RoundEnd{RoundEnd::Kind::kSucceeded, "exit barrier timed out", false};
  }
  co_return *round_end_;
}

void StoreRendezvous::interrupt() {
  interrupted_ = true;
  connect_cancel_.emit(asio::cancellation_type::terminal);
  if (main_) main_->close();
  event_timer_.cancel();
}

asio::awaitable<void> StoreRendezvous::say_goodbye(Exit how) {
  if (!protocol_ || interrupted_ || store_broken_ || how == Exit::kLeaving) co_return;
  try {
    if (how == Exit::kFailed) co_await protocol_->close_job("failed: no restarts left");
    if (formed_) {
      co_await protocol_->say_bye(*formed_);
      // The store's host leaves last, so the others can still read how the job ended.
      if (host_) co_await protocol_->wait_byes(*formed_, s_.close_timeout);
    }
  } catch (const std::exception&) {
    // The store is gone: nothing left to tell anyone.
  }
}

asio::awaitable<void> StoreRendezvous::shutdown(Exit how) {
  workers_store_.reset();
  co_await say_goodbye(how);
  stopping_ = true;
  watch_wake_.notify();
  if (watch_) watch_->close();
  if (etcd_main_ && !interrupted_) {
    // Revoking the lease ends the running round for the others at once (its will).
    co_await etcd_main_->end(std::min<Millis>(s_.read_timeout, std::chrono::seconds(5)));
  }
  if (main_) main_->close();  // a leaving node's will ends the running round for the others
  host_.reset();
}

}  // namespace ddprun::agent
