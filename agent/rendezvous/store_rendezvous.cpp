#include "agent/rendezvous/store_rendezvous.hpp"

#include <sys/random.h>
#include <unistd.h>

#include <boost/asio/async_result.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <system_error>

#include "store/sys/net.hpp"
#include "store/sys/log.hpp"
#include "agent/rendezvous/round_watcher.hpp"
#include "store/server.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using store::StoreError;

namespace {

std::string random_hex(int bytes) {
  unsigned char b[16] = {};
  if (::getrandom(b, static_cast<size_t>(bytes), 0) != bytes) {
    auto t = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
    for (int i = 0; i < bytes; ++i) b[i] = static_cast<unsigned char>(t >> (8 * (i % 8)));
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < bytes; ++i) {
    out += kHex[b[i] >> 4];
    out += kHex[b[i] & 15];
  }
  return out;
}

std::string bracketed(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

}  // namespace

StoreRendezvous::StoreRendezvous(asio::io_context& io, RendezvousSettings settings)
    : io_(io), s_(std::move(settings)), event_timer_(io) {
  self_.addr = s_.local_addr.empty() ? sys::fq_host_name() : s_.local_addr;
  self_.id = self_.addr + ":" + std::to_string(::getpid()) + ":" + random_hex(3);
  self_.hint = s_.node_rank_hint;
}

StoreRendezvous::~StoreRendezvous() {
  // A blocked call on the worker thread ends once its connection is interrupted.
  if (client_) client_->interrupt();
  pool_.join();
  watcher_.reset();
  workers_store_.reset();
  client_.reset();
  host_.reset();
}

// Callers pass closures that capture only pointers and references (to `this` and to named
// locals of the awaiting coroutine, which outlive the call): GCC 12 copies temporaries of a
// co_await expression bitwise into the coroutine frame, which corrupts a closure holding
// std::string members (seen as a bad free under ASan).
template <typename F>
asio::awaitable<std::invoke_result_t<F>> StoreRendezvous::blocking(F f) {
  // A plain completion handler rather than a coroutine on the pool: the result (or the
  // exception) is handed back to the awaiting coroutine on the io_context.
  using R = std::invoke_result_t<F>;
  auto* fn = new F(std::move(f));
  return asio::async_initiate<decltype(asio::use_awaitable), void(std::exception_ptr, R)>(
      [this, fn](auto handler) {
        asio::post(pool_, [handler = std::move(handler), fn]() mutable {
          std::unique_ptr<F> owned(fn);
          std::exception_ptr error;
          auto result = std::make_unique<R>();
          try {
            *result = (*owned)();
          } catch (...) {
            error = std::current_exception();
          }
          owned.reset();
          auto ex = asio::get_associated_executor(handler);
          asio::dispatch(ex, [handler = std::move(handler), error, r = result.release()]() mutable {
            std::unique_ptr<R> owned_result(r);
            std::move(handler)(error, std::move(*owned_result));
          });
        });
      },
      asio::use_awaitable);
}

std::string StoreRendezvous::endpoint() const {
  return bracketed(s_.endpoint_host) + ":" + std::to_string(s_.endpoint_port);
}

void StoreRendezvous::host_store() {
  bool want = s_.is_host.value_or(sys::names_this_machine(s_.endpoint_host));
  if (!want) return;
  store::ServerOptions opts;
  opts.host = s_.bind_host;
  opts.port = static_cast<uint16_t>(s_.endpoint_port);
  opts.log_prefix = "[ddprun rendezvous store]";
  try {
    host_ = std::make_unique<store::ServerThread>(opts);
    sys::log_line("hosting the rendezvous store of job '" + s_.run_id + "' on " +
             bracketed(s_.bind_host) + ":" + std::to_string(host_->port()));
  } catch (const std::system_error& e) {
    if (s_.is_host) {
      throw RendezvousError(std::string("cannot host the rendezvous store: ") + e.what() +
                            (s_.backend == "static" ? " (is another job using --master-port " +
                                                          std::to_string(s_.endpoint_port) + "?)"
                                                    : ""));
    }
    // torchrun's rule: the endpoint names this machine but another process (another agent
    // of this job on the same host, or a ddpstore) serves it: be its client.
  }
}

asio::awaitable<void> StoreRendezvous::connect() {
  host_store();
  const std::string prefix = "/ddprun/" + s_.run_id + "/";
  store::ClientOptions opts;
  opts.connect_timeout = s_.join_timeout;
  opts.timeout = s_.read_timeout;
  const std::string host = s_.endpoint_host;
  const auto port = static_cast<uint16_t>(s_.endpoint_port);
  const Millis interval = s_.keep_alive_interval;
  const int probes = s_.keep_alive_max_attempt;
  std::unique_ptr<PrefixClient> watch_client;
  try {
    auto pair = co_await blocking([&] {
      auto main = std::make_unique<PrefixClient>(store::Client::connect(host, port, opts), prefix);
      auto watch = std::make_unique<PrefixClient>(store::Client::connect(host, port, opts), prefix);
      main->keep_alive(interval, probes);
      watch->keep_alive(interval, probes);
      return std::make_pair(std::move(main), std::move(watch));
    });
    client_ = std::move(pair.first);
    watch_client = std::move(pair.second);
  } catch (const StoreError& e) {
    if (e.kind() == StoreError::Kind::kConnect) {
      throw RendezvousError("cannot reach the rendezvous store at " + endpoint() + " within " +
                            sys::seconds_text(s_.join_timeout) + " (join_timeout): " + e.what());
    }
    throw RendezvousError("the rendezvous store at " + endpoint() +
                          " does not work as a ddprun store (" + e.what() +
                          "); point --rdzv-endpoint at a ddprun agent's or ddpstore's port");
  }
  protocol_ = std::make_unique<RoundProtocol>(*client_, s_, self_);
  watcher_ = std::make_unique<RoundWatcher>(
      io_, std::move(watch_client),
      [this](int round, std::optional<std::string> value, std::string error) {
        on_change(round, std::move(value), std::move(error));
      });
}

asio::awaitable<RendezvousInfo> StoreRendezvous::next_rendezvous(int, int local_world_size) {
  if (store_broken_) throw RendezvousError("lost the rendezvous store at " + endpoint());
  if (!protocol_) co_await connect();
  // This node's workers' store for the round, ready before anyone can pick it as rank 0.
  workers_store_.reset();
  try {
    store::ServerOptions opts;
    opts.host = s_.bind_host;
    opts.port = 0;
    workers_store_ = std::make_unique<store::Server>(io_, opts);
  } catch (const std::system_error& e) {
    throw RendezvousError(std::string("cannot host the workers' store: ") + e.what());
  }
  self_.nproc = local_world_size;
  self_.port = workers_store_->port();
  NodeDesc self = self_;
  const FormedRound* previous = formed_ ? &*formed_ : nullptr;
  std::optional<RoundChange> change = last_change_;
  const bool first = !formed_;
  const auto started = Clock::now();
  FormedRound f;
  try {
    auto work = [this, &self, previous, &change] {
      protocol_->set_self(self);
      return protocol_->join(previous, change);
    };
    f = co_await blocking(work);
  } catch (const JobClosed& e) {
    // A member of the finished job leaves with success; a late node did nothing: 1.
    throw RendezvousError(e.what(), formed_ && e.succeeded() ? 0 : 1);
  } catch (const RendezvousFailed& e) {
    throw RendezvousError(e.what());
  } catch (const StoreError& e) {
    if (interrupted_) throw RendezvousError("rendezvous interrupted");
    store_broken_ = true;
    throw RendezvousError("lost the rendezvous store at " + endpoint() + ": " + e.what());
  }
  formed_ = f;
  last_change_.reset();
  round_end_.reset();
  const int me = f.index;
  const int rank0 = f.ranks.rank0_index;
  if (rank0 != me) workers_store_.reset();
  watcher_->watch(f.round);

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
  info.max_restarts = protocol_->max_restarts();
  auto ms = std::chrono::duration_cast<Millis>(Clock::now() - started).count();
  sys::log_line("rendezvous round " + std::to_string(f.round) + " of job '" + s_.run_id + "' (" +
           std::string(s_.backend) + ", " + endpoint() + ") " + (first ? "formed" : "re-formed") +
           " in " + std::to_string(ms) + " ms: node rank " + std::to_string(info.group_rank) +
           " of " + std::to_string(info.group_world_size) + " nodes, world size " +
           std::to_string(info.world_size) + ", master " + bracketed(info.master_addr) + ":" +
           std::to_string(info.master_port) + ", restart count " +
           std::to_string(info.restart_count) + " of " + std::to_string(info.max_restarts));
  co_return info;
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
      e.local = c.node_id == self_.id;
      e.what = node_name(c.node_id) + " reported a failed worker";
      break;
    case RoundChange::Kind::kJoin:
      e.kind = RoundEnd::Kind::kNodeJoined;
      e.what = "a new node (" + c.node_id + ") is waiting to join";
      break;
    case RoundChange::Kind::kDead:
      e.kind = RoundEnd::Kind::kNodeLost;
      e.what = node_name(c.node_id) + " is gone (its connection to the store closed)";
      break;
  }
  return e;
}

RoundEnd StoreRendezvous::store_lost(const std::string& error) const {
  return RoundEnd{RoundEnd::Kind::kStoreLost, false,
                  "lost the rendezvous store at " + endpoint() + ": " + error};
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
    RoundChange c =
        co_await blocking([this, round, &value] { return protocol_->end_round(round, value); });
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
  const FormedRound f = *formed_;
  if (!round_end_) {
    try {
      co_await blocking([this, &f] { return protocol_->report_success(f); });
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
    co_return RoundEnd{RoundEnd::Kind::kSucceeded, true, "exit barrier timed out"};
  }
  co_return *round_end_;
}

void StoreRendezvous::interrupt() {
  interrupted_ = true;
  if (client_) client_->interrupt();
  event_timer_.cancel();
}

asio::awaitable<void> StoreRendezvous::shutdown(Exit how) {
  workers_store_.reset();
  if (protocol_ && !interrupted_ && !store_broken_) {
    std::optional<FormedRound> f = formed_;
    const bool hosting = host_ != nullptr;
    const Millis linger = s_.close_timeout;
    try {
      co_await blocking([this, how, &f, hosting, linger] {
        if (how == Exit::kFailed) protocol_->close_job("failed: no restarts left");
        if (f && how != Exit::kLeaving) protocol_->say_bye(*f);
        // The store's host leaves last, so the others can still read how the job ended.
        if (f && hosting && how != Exit::kLeaving) protocol_->wait_byes(*f, linger);
        return 0;
      });
    } catch (const std::exception&) {
      // The store is gone: nothing left to tell anyone.
    }
  }
  watcher_.reset();
  if (client_) client_->interrupt();
  pool_.join();
  client_.reset();  // a leaving node's will ends the running round for the others
  host_.reset();
}

}  // namespace ddprun::agent
