// The store server: a c10d TCPStore-compatible key-value store on Boost.Asio, serving torch
// 1.13 and torch 2.x clients (dialect detected per connection) and our Client.
//
// Threads: a Server runs entirely on the io_context it is given; construct it anywhere,
// call every other method on that io_context's thread. ServerThread bundles an io_context,
// its thread and a Server, for hosting a store in-process (the agent does).
//
// Bad input (malformed frame, unknown opcode, a key/value/key count over Limits, ADD on a
// non-numeric value) closes that one connection with one log line naming the peer and the
// reason; other clients are unaffected. Idle connections are never timed out.
//
// Refinements of the agreed store API contract: Limits lives in protocol.hpp
// (included here, same namespace); ServerOptions::log_prefix and
// Server::connection_count() were added. Destroying or closing a Server closes its
// listening socket at once, so the same port can be bound again right away.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "store/protocol.hpp"

namespace boost::asio {
class io_context;
}

namespace ddprun::store {

struct ServerOptions {
  std::string host = "0.0.0.0";  // address or name to bind; "::" / IPv6 literals supported
  uint16_t port = 0;             // 0 = pick a free port; Server::port() reports it
  Limits limits;
  // Memory that replies waiting to be sent may hold beyond 64 KiB per connection, all
  // connections together (output_budget.hpp). A client that does not read its replies stops
  // being read from; one reply larger than this closes its connection.
  size_t max_output_bytes = size_t{256} << 20;
  // While connections wait for that budget, one that holds some of it and has not read any of
  // its replies for this long is closed (server_budget.cpp).
  std::chrono::milliseconds reply_stall_timeout{std::chrono::seconds(10)};
  int backlog = 0;                            // 0 = /proc/sys/net/core/somaxconn
  std::string log_prefix = "[ddprun store]";  // log lines: "<prefix> host:pid: ..."
  // The store's secret (PROTOCOL.md, "AUTH"). Empty: open to every client, torch's included.
  // Set: a connection must prove it knows the secret (HMAC challenge-response; the secret
  // never crosses the wire) before anything else, or it is closed and logged, at most one
  // line per second per reason: "refused 10.0.0.7:51234: no token" / "wrong token". torch's
  // clients cannot authenticate: a store with a token is for ddprun's agents only.
  std::string token;
  // A connection to a store with a token that has not authenticated by then is refused.
  std::chrono::milliseconds auth_timeout{std::chrono::seconds(10)};
  // A store proxy's multiplexed session outlives its connection this long, so the proxy can
  // reconnect and resume it with nothing lost or done twice (PROTOCOL.md).
  std::chrono::milliseconds mux_resume_timeout{std::chrono::seconds(60)};
};

namespace detail {
struct ServerCore;
}

class Server {
 public:
  // Binds and listens; throws std::system_error with a clear message on failure
  // ("cannot listen on 0.0.0.0:29500: Address already in use").
  Server(boost::asio::io_context& io, ServerOptions options);
  ~Server();  // closes the listener and every connection
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const { return port_; }
  // Stops accepting and drops every connection (idempotent).
  void close();
  // Open client connections (for tests and stats).
  size_t connection_count() const;
  // Who may connect: nullopt (the default) = everyone; else only these peer addresses (an
  // IPv4-mapped IPv6 peer counts as its IPv4 address, either way round). Loopback is not
  // implied: list 127.0.0.1 / ::1 to let local clients in. A refused peer is closed right
  // after accept and logged (rate-limited) with `reason`: "refused 10.0.0.9:40000: <reason>".
  // Open connections from peers the new list leaves out are closed (and logged) too.
  void set_allowed_peers(std::optional<std::vector<boost::asio::ip::address>> peers,
                         std::string reason = "not an allowed peer");

 private:
  std::shared_ptr<detail::ServerCore> core_;  // shared with the connections' coroutines
  uint16_t port_ = 0;
};

// Owns an io_context, a thread running it and a Server on it. Thread-safe to construct and
// destroy from any thread.
class ServerThread {
 public:
  explicit ServerThread(ServerOptions options);  // throws like Server
  ~ServerThread();                               // stops and joins
  ServerThread(const ServerThread&) = delete;
  ServerThread& operator=(const ServerThread&) = delete;

  uint16_t port() const { return port_; }

 private:
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  uint16_t port_ = 0;
};

}  // namespace ddprun::store
