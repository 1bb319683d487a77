#include "agent/health/http_server.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <system_error>

#include "agent/health/http_connection.hpp"
#include "store/sys/acceptor.hpp"
#include "store/sys/fd_limit.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using health_detail::Core;
using health_detail::HttpConnection;

// Throws std::system_error "cannot serve health on <endpoint>: <reason>".
[[noreturn]] void fail(const std::error_code& ec, const std::string& endpoint) {
  throw std::system_error(ec, "cannot serve health on " + endpoint);
}

tcp::endpoint parse_endpoint(const std::string& host, int port, const std::string& endpoint) {
  if (port < 0 || port > 65535) fail(std::make_error_code(std::errc::invalid_argument), endpoint);
  boost::system::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (ec) {
    throw std::system_error(std::make_error_code(std::errc::invalid_argument),
                            "cannot serve health on " + endpoint + ": not an IP address");
  }
  return tcp::endpoint(address, static_cast<unsigned short>(port));
}

// Hands each accepted socket to a connection. When max_connections are open, the one that has
// waited longest for its request (or to write its response) is closed to make room: a probe,
// which sends its request at once, is served however many idle, slow or unread connections
// hold the server. Ends when the server closes.
asio::awaitable<void> accept_loop(std::shared_ptr<Core> core) {
  constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);
  while (!core->closed) {
    auto [ec, socket] = co_await core->acceptor.async_accept(kUseTuple);
    if (core->closed) break;
    if (!ec) {
      size_t open = 0;
      HttpConnection* longest = nullptr;
      for (HttpConnection* c : core->connections) {
        if (c->closed()) continue;  // evicted, its coroutine not ended yet
        ++open;
        if (!longest || c->waiting_since() < longest->waiting_since()) longest = c;
      }
      if (open >= core->limits.max_connections && longest) {
        longest->close();
        core->log_once(&core->logged_over_limit,
                       "health server on " + core->endpoint + ": " +
                           std::to_string(core->limits.max_connections) +
                           " connections open: each new one closes the one that has waited "
                           "longest (logged once)");
      }
      try {
        std::make_shared<HttpConnection>(core, std::move(socket))->start();
      } catch (const std::exception&) {
        // Out of memory for this one connection: it is dropped with its socket.
      }
      continue;
    }
    if (!sys::out_of_resources(ec)) continue;  // that one connection failed (e.g. reset)
    core->log_once(&core->logged_accept_error,
                   "health server on " + core->endpoint +
                       ": accept failed: " + sys::accept_failure_text(ec) +
                       "; new connections wait until descriptors free up (logged once)");
    // The pending connection stays in the backlog: back off instead of spinning on it.
    core->retry_timer.expires_after(std::chrono::milliseconds(50));
    co_await core->retry_timer.async_wait(kUseTuple);
  }
}

}  // namespace

namespace health_detail {

void Core::close() {
  if (closed) return;
  closed = true;
  boost::system::error_code ignored;
  acceptor.close(ignored);
  retry_timer.cancel();
  // Each close() leaves the set as is: a connection leaves it only when its coroutine ends.
  for (HttpConnection* c : connections) c->close();
  if (!handler_running) handler = nullptr;  // else the connection drops it once it returns
}

void Core::log_once(bool* logged, const std::string& message) const {
  if (*logged) return;
  *logged = true;
  sys::log_line(message);
}

}  // namespace health_detail

HealthServer::HealthServer(asio::io_context& io, const std::string& host, int port,
                           HttpHandler handler)
    : HealthServer(io, host, port, std::move(handler), Limits{}) {}

HealthServer::HealthServer(asio::io_context& io, const std::string& host, int port,
                           HttpHandler handler, Limits limits)
    : core_(std::make_shared<Core>(io, std::move(handler), limits)) {
  const std::string endpoint = sys::endpoint_text(host, port);
  sys::open_listener(core_->acceptor, parse_endpoint(host, port, endpoint),
                     asio::socket_base::max_listen_connections,
                     "cannot serve health on " + endpoint);
  port_ = core_->acceptor.local_endpoint().port();
  core_->endpoint = sys::endpoint_text(host, port_);
  asio::co_spawn(io, accept_loop(core_), asio::detached);
}

HealthServer::~HealthServer() {
  core_->close();
}

size_t HealthServer::open_connections() const {
  return core_->connections.size();
}

}  // namespace ddprun::agent
