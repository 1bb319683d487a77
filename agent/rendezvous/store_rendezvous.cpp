#include "agent/rendezvous/store_rendezvous.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdlib>
#include <system_error>
#include <utility>

#include "agent/rendezvous/workers_store_peers.hpp"
#include "store/client.hpp"
#include "store/proxy.hpp"
#include "store/server.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"
#include "store/sys/random.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using store::StoreError;

StoreRendezvous::StoreRendezvous(asio::io_context& io, RendezvousSettings settings,
                                 LeaseObserver lease_observer)
    : io_(io),
      s_(std::move(settings)),
      link_(make_store_link(io, s_, std::move(lease_observer))),
      event_timer_(io),
      watch_wake_(io.get_executor()) {
  self_.addr = s_.local_addr.empty() ? sys::fq_host_name() : s_.local_addr;
  self_.id = self_.addr + ":" + std::to_string(::getpid()) + ":" + sys::random_hex(3);
  self_.hint = s_.node_rank_hint;
}

StoreRendezvous::~StoreRendezvous() = default;

std::string StoreRendezvous::endpoint() const {
  return link_->endpoint();
}

asio::awaitable<void> StoreRendezvous::connect() {
  if (interrupted_) throw RendezvousError("rendezvous interrupted");
  StoreLink::Clients clients;
  try {
    // Cancelled by interrupt(): a signal must not wait while the store does not answer.
    clients = co_await link_->connect(connect_cancel_.slot());
  } catch (const RendezvousError&) {
    if (interrupted_) throw RendezvousError("rendezvous interrupted");
    throw;
  }
  if (interrupted_) throw RendezvousError("rendezvous interrupted");
  main_ = std::move(clients.main);
  watch_ = std::move(clients.watch);
  recoveries_ = std::move(clients.recoveries);
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
  info.replica_ports.resize(f.nodes.size());
  for (size_t i = 0; i < f.nodes.size(); ++i) {
    info.members[f.ranks.node_rank[i]] = f.nodes[i].addr;
    info.replica_ports[f.ranks.node_rank[i]] = f.nodes[i].replica_port;
  }
  return info;
}

}  // namespace

asio::awaitable<RendezvousInfo> StoreRendezvous::next_rendezvous(int local_world_size) {
  if (store_broken_) throw RendezvousError("lost the rendezvous store at " + endpoint());
  if (!protocol_) co_await connect();
  // This node's workers' store for the round, ready before anyone can pick it as rank 0.
  host_workers_store();
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
  in_place_restarts_ = 0;
  if (recoveries_ && !watching_generations_) {
    watching_generations_ = true;
    asio::co_spawn(io_, watch_generations(), asio::detached);
  }
  if (f.ranks.rank0_index != f.index) {
    workers_store_.reset();
  } else {
    admit_members(f);
  }
  watch_round_ = f.round;
  watch_wake_.notify();

  RendezvousInfo info = info_for(f, protocol_->max_restarts());
  if (s_.store_proxy) start_proxy(info);
  log_round(info, f.round, first,
            std::chrono::duration_cast<Millis>(Clock::now() - started).count());
  co_return info;
}

void StoreRendezvous::host_workers_store() {
  proxy_.reset();
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
}

void StoreRendezvous::log_round(const RendezvousInfo& info, int round, bool first,
                                long long ms) const {
  sys::log_line("rendezvous round " + std::to_string(round) + " of job '" + s_.run_id + "' (" +
                std::string(backend_name(s_.backend)) + ", " + endpoint() + ") " +
                (first ? "formed" : "re-formed") + " in " + std::to_string(ms) + " ms: node rank " +
                std::to_string(info.group_rank) + " of " + std::to_string(info.group_world_size) +
                " nodes, world size " + std::to_string(info.world_size) + ", master " +
                sys::endpoint_text(info.master_addr, info.master_port) + ", restart count " +
                std::to_string(info.restart_count) + " of " + std::to_string(info.max_restarts) +
                (proxy_ ? ", workers through this node's store proxy on " +
                              sys::endpoint_text(info.master_addr, info.master_port)
                        : std::string()));
}

// --store-proxy: the round's workers' store behind a proxy on loopback, for this node's workers
// only. If its link to the store breaks, the workers' store clients fail and so do the workers:
// the usual failure path.
void StoreRendezvous::start_proxy(RendezvousInfo& info) {
  store::ProxyOptions po;
  po.upstream_host = info.store_host;
  po.upstream_port = static_cast<uint16_t>(info.store_port);
  po.upstream.connect_timeout = s_.read_timeout;
  po.log_prefix = "[ddprun store proxy]";
  try {
    proxy_ = std::make_unique<store::StoreProxy>(io_, po);
  } catch (const std::system_error& e) {
    throw RendezvousError(std::string("cannot start the store proxy: ") + e.what());
  }
  info.master_addr = "127.0.0.1";
  info.master_port = proxy_->port();
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
      e.restart_allowed = formed_ && may_restart(restarts_known(), protocol_->max_restarts());
      e.hang = c.hang;
      e.what =
          node_name(c.node_id) + (c.hang ? " reported a hung worker" : " reported a failed worker");
      break;
    case RoundChange::Kind::kJoin:
      e.kind = RoundEnd::Kind::kNodeJoined;
      e.what = "a new node (" + c.node_id + ") is waiting to join";
      break;
    case RoundChange::Kind::kDead:
      e.kind = RoundEnd::Kind::kNodeLost;
      e.what = node_name(c.node_id) + link_->gone_text();
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

namespace {

// In-process recovery's keys of round `round` (round_protocol.hpp): the claim of generation g,
// and the count of nodes whose workers all run it.
std::string generation_key(int round, int g) {
  return RoundProtocol::key(round, "gen/" + std::to_string(g));
}
std::string generation_ready_key(int round, int g) {
  return generation_key(round, g) + "/ready";
}

// A claim, "<restart count> <agent id>": (count, id); id empty when it is not one.
std::pair<int, std::string> parse_claim(const std::string& value) {
  const auto space = value.find(' ');
  if (space == std::string::npos) return {0, {}};
  return {std::atoi(value.substr(0, space).c_str()), value.substr(space + 1)};
}

}  // namespace

int StoreRendezvous::restarts_known() const {
  return formed_ ? formed_->restart_count + in_place_restarts_ : 0;
}

// In-process recovery across nodes (round_protocol.hpp has the keys). Generation g of round R
// runs everywhere once every node has counted itself in r/R/gen/<g>/ready; the next one is
// claimed by writing r/R/gen/<g+1> (first writer wins), which wakes every node's generation
// watcher; the restart it spends is counted in r/R/inplace, which the next round's count adds.
asio::awaitable<RendezvousHandler::InPlaceRestart> StoreRendezvous::restart_in_place(
    int generation) {
  if (!formed_ || round_end_ || store_broken_)
    co_return InPlaceRestart{std::nullopt, "the round ended"};
  const FormedRound& f = *formed_;
  const auto nodes = static_cast<int64_t>(f.nodes.size());
  const std::string in_place = RoundProtocol::key(f.round, "inplace");
  try {
    const int64_t joined = co_await main_->add(generation_ready_key(f.round, generation), 0);
    if (joined < nodes) {
      co_return InPlaceRestart{std::nullopt,
                               "the workers of " + std::to_string(nodes - joined) + " of " +
                                   std::to_string(nodes) +
                                   " nodes do not all run a ddprun::TrainingLoop of process group "
                                   "generation " +
                                   std::to_string(generation)};
    }
    const int64_t used = co_await main_->add(in_place, 1);
    const int count = f.restart_count + static_cast<int>(used);
    if (!may_restart(count - 1, protocol_->max_restarts())) {
      co_await main_->add(in_place, -1);
      co_return InPlaceRestart{};
    }
    const std::string mine = std::to_string(count) + " " + self_.id;
    const std::string stored =
        co_await main_->compare_set(generation_key(f.round, generation + 1), "", mine);
    if (stored != mine) {
      co_await main_->add(in_place, -1);
      co_return InPlaceRestart{std::nullopt, node_name(parse_claim(stored).second) +
                                                 " began a recovery of its own at the same time"};
    }
    in_place_restarts_ = std::max(in_place_restarts_, static_cast<int>(used));
    co_return InPlaceRestart{count, {}};
  } catch (const std::exception& e) {
    co_return InPlaceRestart{std::nullopt, std::string("the rendezvous store: ") + e.what()};
  }
}

asio::awaitable<void> StoreRendezvous::share_generation(int generation, bool joined) {
  if (!formed_ || store_broken_) co_return;
  try {
    co_await main_->add(generation_ready_key(formed_->round, generation), joined ? 1 : -1);
  } catch (const std::exception&) {
    // The store is gone: the round watcher says so, and the round ends.
  }
}

asio::awaitable<bool> StoreRendezvous::generation_formed(int generation) {
  if (!formed_ || store_broken_) co_return false;
  try {
    const int64_t joined = co_await main_->add(generation_ready_key(formed_->round, generation), 0);
    co_return joined >= static_cast<int64_t>(formed_->nodes.size());
  } catch (const std::exception&) {
    co_return false;
  }
}

// The generation watcher: one WAIT on the formed round's next generation key at a time, in
// slices, so that it moves on to a new round's keys. A claim of another node's is its recovery.
asio::awaitable<void> StoreRendezvous::watch_generations() {
  constexpr Millis kSlice{1000};
  int round = -1;
  int next = 1;
  while (!stopping_ && !store_broken_) {
    if (formed_->round != round) round = formed_->round, next = 1;
    const std::string key = generation_key(round, next);
    std::optional<std::string> value;
    try {
      std::vector<std::string> keys{key};
      if (co_await recoveries_->wait(keys, kSlice)) {
        auto got = co_await recoveries_->multi_get(std::move(keys));
        if (!got.empty()) value = std::move(got.front());
      }
    } catch (const std::exception&) {
      break;  // the store is gone: the round watcher reports it
    }
    if (stopping_) break;
    if (!value) continue;
    on_generation(round, next++, *value);
  }
  watching_generations_ = false;
}

void StoreRendezvous::on_generation(int round, int generation, const std::string& value) {
  if (!formed_ || round != formed_->round || round_end_) return;
  const auto [count, id] = parse_claim(value);
  if (id.empty() || id == self_.id) return;
  in_place_restarts_ = std::max(in_place_restarts_, count - formed_->restart_count);
  if (peer_recovery_) peer_recovery_(PeerRecovery{generation, count, node_name(id)});
}

asio::awaitable<RoundEnd> StoreRendezvous::report_failure(bool hang) {
  if (round_end_) co_return *round_end_;
  const int round = formed_->round;
  const std::string value = (hang ? "hang:" : "fail:") + self_.id;
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

// Each node's part under r/<round>/hang/<join index>; written once, read by every node.
asio::awaitable<std::vector<std::string>> StoreRendezvous::exchange_hang_evidence(
    std::string mine, std::chrono::milliseconds timeout) {
  if (!formed_ || store_broken_) co_return std::vector<std::string>{std::move(mine)};
  const FormedRound& f = *formed_;
  auto key_of = [&](size_t index) {
    return RoundProtocol::key(f.round, "hang/" + std::to_string(index));
  };
  std::vector<std::pair<int, std::string>> parts;  // node rank, part
  try {
    std::vector<std::pair<std::string, std::string>> own;
    own.emplace_back(key_of(static_cast<size_t>(f.index)), mine);
    co_await main_->multi_set(std::move(own));
    std::vector<std::string> keys;
    for (size_t i = 0; i < f.nodes.size(); ++i) keys.push_back(key_of(i));
    co_await main_->wait(keys, timeout);  // false: a node said nothing in time
    for (size_t i = 0; i < f.nodes.size(); ++i) {
      std::vector<std::string> one(1, key_of(i));
      if (!co_await main_->check(one)) continue;
      auto value = co_await main_->multi_get(std::move(one));
      if (!value.empty()) parts.emplace_back(f.ranks.node_rank.at(i), std::move(value.front()));
    }
  } catch (const std::exception& e) {
    sys::log_line(std::string("  note: the other nodes' hang evidence is out of reach: ") +
                  e.what());
    co_return std::vector<std::string>{std::move(mine)};
  }
  std::sort(parts.begin(), parts.end());
  std::vector<std::string> out;
  for (auto& p : parts) out.push_back(std::move(p.second));
  co_return out;
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
      if (link_->hosts_store()) co_await protocol_->wait_byes(*formed_, s_.close_timeout);
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
  if (recoveries_) recoveries_->close();
  // Leaving ends this agent's presence for the others at once (etcd: its lease, whose will
  // ends the running round); an interrupted agent leaves that to its guardian.
  if (!interrupted_)
    co_await link_->leave(std::min<Millis>(s_.read_timeout, std::chrono::seconds(5)));
  if (main_) main_->close();  // a leaving node's will ends the running round for the others
}

}  // namespace ddprun::agent
