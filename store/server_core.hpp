// Internals shared by Server and its connections (not a public header).
//
// ServerCore is owned jointly (shared_ptr) by the Server and every connection coroutine, so
// a Server can be destroyed while the io_context still holds those coroutines: the store
// state they touch stays valid until the last one ends.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>

#include "store/server.hpp"
#include "store/store_state.hpp"

namespace ddprun::store {
class Connection;
}

namespace ddprun::store::detail {

struct ServerCore {
  ServerCore(boost::asio::io_context& io, ServerOptions opts)
      : options(std::move(opts)), acceptor(io), retry_timer(io) {}

  void add(Connection& connection);
  void remove(Connection& connection);
  void close();  // stop accepting, close every connection

  ServerOptions options;
  StoreState state;
  boost::asio::ip::tcp::acceptor acceptor;
  boost::asio::steady_timer retry_timer;  // accept back-off when out of file descriptors
  // Shared receive buffer for bursts beyond a connection's small own buffer: the io_context
  // thread is the only user, so idle connections need no large buffer of their own.
  static constexpr size_t kScratchSize = 64 << 10;
  std::unique_ptr<char[]> scratch{new char[kScratchSize]};
  Connection* connections = nullptr;  // intrusive list of open connections
  size_t connection_count = 0;
  bool closed = false;
};

}  // namespace ddprun::store::detail
