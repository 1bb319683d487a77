// Internals shared by Server and its connections (not a public header).
//
// ServerCore is owned jointly (shared_ptr) by the Server and every connection coroutine, so
// a Server can be destroyed while the io_context still holds those coroutines: the store
// state they touch stays valid until the last one ends.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "store/refusal_log.hpp"
#include "store/server.hpp"
#include "store/store_state.hpp"

namespace ddprun::store {
class Connection;
}

namespace ddprun::store::detail {

// A client's socket: bound to the io_context's own executor type rather than
// any_io_executor, which makes each pending operation (one per idle connection) smaller.
using ClientSocket =
    boost::asio::basic_stream_socket<boost::asio::ip::tcp, boost::asio::io_context::executor_type>;

// "10.0.0.7:51234", "[fe80::1]:29400"; an IPv4-mapped IPv6 peer in its IPv4 form.
std::string peer_text(const boost::asio::ip::tcp::endpoint& peer);

struct ServerCore {
  ServerCore(boost::asio::io_context& io, ServerOptions opts)
      : options(std::move(opts)), acceptor(io), retry_timer(io), refusals(options.log_prefix) {}

  void add(Connection& connection);
  void remove(Connection& connection);
  void close();  // stop accepting, close every connection
  // Whether the allow-list (if any) lets `peer` in; closes and logs it when not.
  bool admit(ClientSocket& socket, const boost::asio::ip::tcp::endpoint& peer);
  bool allowed(const boost::asio::ip::address& address) const;
  void set_allowed_peers(std::optional<std::vector<boost::asio::ip::address>> peers,
                         std::string reason);

  ServerOptions options;
  StoreState state;
  boost::asio::ip::tcp::acceptor acceptor;
  boost::asio::steady_timer retry_timer;  // accept back-off when out of file descriptors
  // Shared receive buffer for bursts beyond a connection's small own buffer: the io_context
  // thread is the only user, so idle connections need no large buffer of their own.
  static constexpr size_t kScratchSize = 64 << 10;
  std::unique_ptr<char[]> scratch{new char[kScratchSize]};
  RefusalLog refusals;  // connections refused: no token, a wrong token, not on the allow-list
  // Server::set_allowed_peers: nullopt = everyone; addresses in IPv4 form where mapped.
  std::optional<std::vector<boost::asio::ip::address>> allowed_peers;
  std::string refusal_reason;         // the log's reason for a peer not on the list
  Connection* connections = nullptr;  // intrusive list of open connections
  size_t connection_count = 0;
  bool closed = false;
};

}  // namespace ddprun::store::detail
