#include "store/server.hpp"

#include <netdb.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstring>
#include <fstream>
#include <system_error>

#include "store/connection.hpp"
#include "store/log.hpp"

namespace ddprun::store {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

std::string endpoint_text(const std::string& host, uint16_t port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

int somaxconn() {
  std::ifstream in("/proc/sys/net/core/somaxconn");
  int value = 0;
  if (in >> value && value > 0) return value;
  return SOMAXCONN;
}

// An address literal as is; a name through getaddrinfo (first result).
tcp::endpoint resolve(const std::string& host, uint16_t port) {
  boost::system::error_code ec;
  asio::ip::address address = asio::ip::make_address(host, ec);
  if (!ec) return {address, port};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr) {
    throw std::system_error(std::make_error_code(std::errc::invalid_argument),
                            "cannot listen on " + endpoint_text(host, port) +
                                ": cannot resolve host (" + gai_strerror(rc) + ")");
  }
  tcp::endpoint ep;
  ep.resize(result->ai_addrlen);
  std::memcpy(ep.data(), result->ai_addr, result->ai_addrlen);
  freeaddrinfo(result);
  ep.port(port);
  return ep;
}

void listen(tcp::acceptor& acceptor, const tcp::endpoint& ep, int backlog,
            const std::string& what) {
  boost::system::error_code ec;
  auto check = [&] {
    if (ec) throw std::system_error(ec, "cannot listen on " + what);
  };
  acceptor.open(ep.protocol(), ec);
  check();
  acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  check();
  if (ep.address().is_v6()) {
    acceptor.set_option(asio::ip::v6_only(false), ec);  // "::" also takes IPv4 clients
    ec.clear();
  }
  acceptor.bind(ep, ec);
  check();
  acceptor.listen(backlog > 0 ? backlog : somaxconn(), ec);
  check();
}

bool out_of_resources(const boost::system::error_code& ec) {
  int e = ec.value();
  return ec.category() == boost::system::system_category() &&
         (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM);
}

asio::awaitable<void> accept_loop(std::shared_ptr<detail::ServerCore> core) {
  constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);
  bool reported = false;
  tcp::endpoint peer;
  while (!core->closed) {
    auto [ec, socket] = co_await core->acceptor.async_accept(peer, kUseTuple);
    if (core->closed || ec == asio::error::operation_aborted) break;
    if (!ec) {
      reported = false;
      try {
        std::make_shared<Connection>(core, std::move(socket), peer)->start();
      } catch (const std::exception& e) {
        log_line(core->options.log_prefix, std::string("cannot serve a connection: ") + e.what());
      }
      continue;
    }
    if (!out_of_resources(ec)) continue;  // that one connection failed (e.g. reset)
    if (!reported) {
      log_line(core->options.log_prefix, "accept failed: " + ec.message() +
                                             "; new connections wait until descriptors free up");
      reported = true;
    }
    // The pending connection stays in the backlog: back off instead of spinning on it.
    core->retry_timer.expires_after(std::chrono::milliseconds(50));
    co_await core->retry_timer.async_wait(kUseTuple);
  }
}

}  // namespace

namespace detail {

void ServerCore::add(Connection& connection) {
  connection.next_ = connections;
  if (connections != nullptr) connections->prev_ = &connection;
  connections = &connection;
  ++connection_count;
}

void ServerCore::remove(Connection& connection) {
  if (connection.prev_ != nullptr) {
    connection.prev_->next_ = connection.next_;
  } else {
    connections = connection.next_;
  }
  if (connection.next_ != nullptr) connection.next_->prev_ = connection.prev_;
  --connection_count;
}

void ServerCore::close() {
  if (closed) return;
  closed = true;
  boost::system::error_code ignored;
  acceptor.close(ignored);
  retry_timer.cancel();
  for (Connection* c = connections; c != nullptr; c = c->next_) c->close();
}

}  // namespace detail

Server::Server(asio::io_context& io, ServerOptions options)
    : core_(std::make_shared<detail::ServerCore>(io, std::move(options))) {
  const ServerOptions& opts = core_->options;
  std::string what = endpoint_text(opts.host, opts.port);
  listen(core_->acceptor, resolve(opts.host, opts.port), opts.backlog, what);
  port_ = core_->acceptor.local_endpoint().port();
  asio::co_spawn(io, accept_loop(core_), asio::detached);
}

Server::~Server() {
  close();
}

void Server::close() {
  core_->close();
}

size_t Server::connection_count() const {
  return core_->connection_count;
}

ServerThread::ServerThread(ServerOptions options)
    : io_(std::make_unique<asio::io_context>(1)),
      server_(std::make_unique<Server>(*io_, std::move(options))),
      port_(server_->port()) {
  thread_ = std::thread([io = io_.get()] {
    for (;;) {
      try {
        io->run();
        return;
      } catch (const std::exception& e) {  // a handler threw: log it and keep serving
        log_line("[ddprun store]", std::string("unexpected exception: ") + e.what());
      }
    }
  });
}

ServerThread::~ServerThread() {
  // Closing cancels every pending operation; run() returns once their handlers are done.
  asio::post(*io_, [server = server_.get()] { server->close(); });
  thread_.join();
  server_.reset();
  io_.reset();
}

}  // namespace ddprun::store
