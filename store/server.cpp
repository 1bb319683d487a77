#include "store/server.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstring>
#include <fstream>
#include <system_error>

#include "store/connection.hpp"
#include "store/sys/acceptor.hpp"
#include "store/sys/fd_limit.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"

namespace ddprun::store {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

int somaxconn() {
  std::ifstream in("/proc/sys/net/core/somaxconn");
  int value = 0;
  if (in >> value && value > 0) return value;
  return SOMAXCONN;
}

// An address literal as is; a name through the resolver (first result).
tcp::endpoint resolve(const std::string& host, uint16_t port) {
  std::string error;
  auto addrs = sys::resolve(host, port, true, &error);
  if (addrs.empty()) {
    throw std::system_error(std::make_error_code(std::errc::invalid_argument),
                            "cannot listen on " + sys::endpoint_text(host, port) + ": " + error);
  }
  tcp::endpoint ep;
  ep.resize(addrs.front().len);
  std::memcpy(ep.data(), &addrs.front().addr, addrs.front().len);
  return ep;
}

asio::awaitable<void> accept_loop(std::shared_ptr<detail::ServerCore> core) {
  constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);
  bool reported = false;
  tcp::endpoint peer;
  auto& io = static_cast<asio::io_context&>(core->acceptor.get_executor().context());
  while (!core->closed) {
    auto [ec, socket] = co_await core->acceptor.async_accept(io, peer, kUseTuple);
    if (core->closed || ec == asio::error::operation_aborted) break;
    if (!ec) {
      reported = false;
      if (!core->admit(socket, peer)) continue;
      try {
        std::make_shared<Connection>(core, std::move(socket), peer)->start();
      } catch (const std::exception& e) {
        sys::log_line(core->options.log_prefix,
                      std::string("cannot serve a connection: ") + e.what());
      }
      continue;
    }
    if (!sys::out_of_resources(ec)) continue;  // that one connection failed (e.g. reset)
    if (!reported) {
      sys::log_line(core->options.log_prefix,
                    "accept failed: " + sys::accept_failure_text(ec) +
                        "; new connections wait in the backlog until descriptors free up "
                        "(logged once until an accept succeeds)");
      reported = true;
    }
    // The pending connection stays in the backlog: back off instead of spinning on it.
    core->retry_timer.expires_after(std::chrono::milliseconds(50));
    co_await core->retry_timer.async_wait(kUseTuple);
  }
}

}  // namespace

namespace detail {

namespace {

asio::ip::address ipv4_form(const asio::ip::address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  }
  return a;
}

}  // namespace

std::string peer_text(const tcp::endpoint& peer) {
  if (peer.port() == 0) return "unknown peer";
  const asio::ip::address a = ipv4_form(peer.address());
  std::string addr = a.to_string();
  if (a.is_v6()) addr = "[" + addr + "]";
  return addr + ":" + std::to_string(peer.port());
}

bool ServerCore::allowed(const asio::ip::address& address) const {
  if (!allowed_peers) return true;
  const asio::ip::address a = ipv4_form(address);
  for (const asio::ip::address& p : *allowed_peers) {
    if (p == a) return true;
  }
  return false;
}

bool ServerCore::admit(ClientSocket& socket, const tcp::endpoint& peer) {
  if (allowed(peer.address())) return true;
  refusals.refused(peer_text(peer), refusal_reason);
  boost::system::error_code ignored;
  socket.close(ignored);
  return false;
}

void ServerCore::set_allowed_peers(std::optional<std::vector<asio::ip::address>> peers,
                                   std::string reason) {
  if (peers) {
    for (asio::ip::address& a : *peers) a = ipv4_form(a);
  }
  allowed_peers = std::move(peers);
  refusal_reason = std::move(reason);
  for (Connection* c = connections; c != nullptr; c = c->next_) {
    if (!c->closed_ && !allowed(c->peer_.address())) {
      refusals.refused(peer_text(c->peer_), refusal_reason);
      c->close();
    }
  }
}

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
  std::string what = sys::endpoint_text(opts.host, opts.port);
  sys::open_listener(core_->acceptor, resolve(opts.host, opts.port),
                     opts.backlog > 0 ? opts.backlog : somaxconn(), "cannot listen on " + what);
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

void Server::set_allowed_peers(std::optional<std::vector<asio::ip::address>> peers,
                               std::string reason) {
  core_->set_allowed_peers(std::move(peers), std::move(reason));
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
        sys::log_line("[ddprun store]", std::string("unexpected exception: ") + e.what());
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
