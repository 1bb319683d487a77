// Internals of HealthServer (not a public header): the state a server shares with its
// connections' coroutines, and one connection.
//
// Core is owned jointly (shared_ptr) by the HealthServer and every coroutine, so the server can
// be destroyed while coroutines are suspended: they resume with an error (their sockets were
// closed), see `closed`, and end, touching only what they co-own.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <memory>
#include <string>
#include <unordered_set>

#include "agent/health/http_server.hpp"

namespace ddprun::agent::health_detail {

class HttpConnection;

struct Core {
  Core(boost::asio::io_context& io, HttpHandler h, const HealthServer::Limits& l)
      : limits(l), handler(std::move(h)), acceptor(io), retry_timer(io) {}

  void close();  // stop accepting, close every connection, drop the handler (idempotent)
  // Logs `message` the first time `*logged` is false (one line per reason).
  void log_once(bool* logged, const std::string& message) const;

  const HealthServer::Limits limits;
  std::string endpoint;  // "127.0.0.1:8080", for log lines
  HttpHandler handler;
  bool handler_running = false;  // close() from inside the handler must not destroy it
  boost::asio::ip::tcp::acceptor acceptor;
  boost::asio::steady_timer retry_timer;            // accept back-off when out of file descriptors
  std::unordered_set<HttpConnection*> connections;  // open ones; each erases itself
  bool closed = false;
  bool logged_over_limit = false;
  bool logged_accept_error = false;
  bool logged_handler_error = false;
};

// One accepted client. Owned by its own coroutine (shared_ptr); listed in Core::connections
// so that Core::close() can reach it.
class HttpConnection final : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(std::shared_ptr<Core> core, boost::asio::ip::tcp::socket socket);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  void start();  // serves on the socket's executor
  void close();  // closes the socket; the coroutine ends on its next resumption
  bool closed() const { return closed_; }
  // Since when it has been waiting for its current request (or writing its response): the
  // longest-waiting connection gives its place to a new one when the server is full.
  std::chrono::steady_clock::time_point waiting_since() const { return waiting_since_; }

 private:
  static boost::asio::awaitable<void> run(std::shared_ptr<HttpConnection> self);
  // Reads one request and answers it; false when the connection is to be closed.
  boost::asio::awaitable<bool> serve_one();
  boost::asio::awaitable<bool> wait_first_byte(std::chrono::steady_clock::time_point deadline);
  // Writes an error response, then closes gently (see linger_close).
  boost::asio::awaitable<void> refuse(int status, std::string_view body);
  // Our side done: FIN, then read and drop what the client still sends (briefly, bounded),
  // so that our last response is not destroyed by a reset.
  boost::asio::awaitable<void> linger_close();
  HttpResponse call_handler(std::string_view target);

  std::shared_ptr<Core> core_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;  // bounded: max_header_bytes plus a little
  bool closed_ = false;
  std::chrono::steady_clock::time_point waiting_since_ = std::chrono::steady_clock::now();
};

}  // namespace ddprun::agent::health_detail
