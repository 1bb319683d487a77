// Internals shared by Server and its connections (not a public header).
//
// ServerCore is owned jointly (shared_ptr) by the Server, every connection and the Poller's
// pending wait, so a Server can be destroyed while the io_context still holds their handlers:
// the store state they touch stays valid until the last one ends.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "store/fan_out.hpp"
#include "store/output_budget.hpp"
#include "store/poller.hpp"
#include "store/refusal_log.hpp"
#include "store/server.hpp"
#include "store/session.hpp"
#include "store/store_state.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::store {
class Connection;
}

namespace ddprun::store::detail {

struct ServerCore;

// "10.0.0.7:51234", "[fe80::1]:29400"; an IPv4-mapped IPv6 peer in its IPv4 form.
std::string peer_text(const boost::asio::ip::tcp::endpoint& peer);

// The listening socket, on the Poller: accepts everything pending (accept4, non-blocking and
// close-on-exec at once) when it becomes readable, and backs off while out of descriptors.
class Listener final : public PollHandler {
 public:
  explicit Listener(ServerCore& core) : core_(core) {}
  // Binds and listens (throws like Server's constructor); returns the bound port.
  uint16_t open(const boost::asio::ip::tcp::endpoint& ep, int backlog, const std::string& what);
  void start();
  void close();

 private:
  void on_events(uint32_t events) override;
  void accept_pending();

  ServerCore& core_;
  sys::UniqueFd fd_;
  Poller::Token token_ = 0;
  bool reported_ = false;  // the out-of-descriptors line went out since the last accept
};

struct ServerCore : std::enable_shared_from_this<ServerCore> {
  ServerCore(boost::asio::io_context& io_context, ServerOptions opts)
      : options(std::move(opts)),
        io(io_context),
        poller(io_context),
        listener(*this),
        retry_timer(io_context),
        refusals(options.log_prefix) {}

  void add(Connection& connection);
  void remove(Connection& connection);
  void close();  // stop accepting, close every connection
  // Whether the allow-list (if any) lets `peer` in; logs it when not.
  bool admit(const boost::asio::ip::tcp::endpoint& peer);
  // Serves an accepted, non-blocking socket.
  void serve(sys::UniqueFd fd, const boost::asio::ip::tcp::endpoint& peer);
  // Output that another connection's request produced (a released WAIT) is sent after the
  // handler that produced it, all such connections together: across the FanOut's threads when
  // there are many, as when one SET releases every rank of a job.
  void defer_flush(Connection& connection);
  void flush_deferred();
  // A paused connection with nothing queued waits for budget that other connections give back
  // (output_budget.hpp); logged at most once a second.
  void wait_for_budget(Connection& connection);
  // After sends on the io_context thread: lets the waiters try again if budget came back.
  void wake_budget_waiters();
  void arm_stall_check();
  void close_stalled();
  bool allowed(const boost::asio::ip::address& address) const;
  // A proxy's multiplexed session whose connection ended waits here to be resumed, for
  // ServerOptions::mux_resume_timeout (server.cpp).
  void park(std::unique_ptr<Session> session);
  std::unique_ptr<Session> unpark(uint64_t id);
  void set_allowed_peers(std::optional<std::vector<boost::asio::ip::address>> peers,
                         std::string reason);

  ServerOptions options;
  StoreState state;
  boost::asio::io_context& io;
  Poller poller;  // client sockets and the listener
  Listener listener;
  boost::asio::steady_timer retry_timer;  // accept back-off when out of file descriptors
  // Shared receive buffer for bursts beyond a connection's small own buffer: the io_context
  // thread is the only user, so idle connections need no large buffer of their own.
  static constexpr size_t kScratchSize = 64 << 10;
  std::unique_ptr<char[]> scratch{new char[kScratchSize]};
  RefusalLog refusals;  // connections refused: no token, a wrong token, not on the allow-list
  // Server::set_allowed_peers: nullopt = everyone; addresses in IPv4 form where mapped.
  std::optional<std::vector<boost::asio::ip::address>> allowed_peers;
  std::string refusal_reason;  // the log's reason for a peer not on the list
  FanOut fan_out{FanOut::default_helpers()};
  std::vector<std::shared_ptr<Connection>> deferred;  // connections with output to send
  OutputBudget budget{options.max_output_bytes};
  std::vector<std::weak_ptr<Connection>> budget_waiters;
  uint64_t budget_returns_seen = 0;  // budget.returns() when the waiters last tried
  std::chrono::steady_clock::time_point budget_logged{};  // the last "budget full" line
  uint64_t budget_waits_unlogged = 0;
  boost::asio::steady_timer stall_timer{io};
  bool stall_check_armed = false;
  Connection* connections = nullptr;  // intrusive list of open connections
  struct Parked final : OutputListener {
    void on_output() override {}  // kept until the session is resumed
  };
  Parked parked_listener;
  struct Detached {
    std::unique_ptr<Session> session;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };
  std::unordered_map<uint64_t, Detached> detached;
  size_t connection_count = 0;
  bool closed = false;
};

}  // namespace ddprun::store::detail
