#include "store/server.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
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

bool ServerCore::admit(const tcp::endpoint& peer) {
  if (allowed(peer.address())) return true;
  refusals.refused(peer_text(peer), refusal_reason);
  return false;
}

void ServerCore::serve(sys::UniqueFd fd, const tcp::endpoint& peer) {
  if (!admit(peer)) return;
  try {
    std::make_shared<Connection>(shared_from_this(), std::move(fd), peer)->start();
  } catch (const std::exception& e) {
    sys::log_line(options.log_prefix, std::string("cannot serve a connection: ") + e.what());
  }
}

void ServerCore::defer_flush(Connection& connection) {
  if (connection.flush_deferred_ || connection.closed_) return;
  connection.flush_deferred_ = true;
  if (deferred.empty()) {
    asio::post(io, [core = shared_from_this()] { core->flush_deferred(); });
  }
  deferred.push_back(connection.shared_from_this());
}

void ServerCore::flush_deferred() {
  // Fewer than this are sent on this thread: waking the helpers costs more than it saves.
  constexpr size_t kFanOutFrom = 64;
  std::vector<std::shared_ptr<Connection>> batch;
  batch.swap(deferred);
  std::vector<int> errors(batch.size());
  auto send = [&batch, &errors](size_t i) {
    errors[i] = batch[i]->send_queued();  // this connection's socket and output only
  };
  if (batch.size() >= kFanOutFrom) {
    fan_out.run(batch.size(), send);
  } else {
    for (size_t i = 0; i < batch.size(); ++i) send(i);
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    Connection& c = *batch[i];
    c.flush_deferred_ = false;
    if (errors[i] != 0) {
      c.close();  // the peer is gone
    } else if (c.read_paused_ && !c.session_->waiting()) {
      // Replies held behind its WAIT just went out: its paused request may fit now.
      asio::post(io, [self = batch[i]] {
        if (!self->closed_ && self->read_paused_) self->on_readable();
      });
    }
  }
  wake_budget_waiters();
}

uint16_t Listener::open(const tcp::endpoint& ep, int backlog, const std::string& what) {
  tcp::acceptor acceptor(core_.io);
  sys::open_listener(acceptor, ep, backlog, what);
  // Linux copies TCP_NODELAY from the listening socket to every socket it accepts: replies
  // are small and must not wait for Nagle, and this saves a setsockopt per connection.
  boost::system::error_code ec;
  acceptor.set_option(tcp::no_delay(true), ec);
  const uint16_t port = acceptor.local_endpoint().port();
  fd_.reset(acceptor.release(ec));
  if (ec) throw std::system_error(ec, what);
  const int flags = ::fcntl(fd_.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd_.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    throw std::system_error(errno, std::generic_category(), what);
  }
  return port;
}

void Listener::start() {
  token_ = core_.poller.add(fd_.get(), *this);
  if (token_ == 0) throw std::system_error(errno, std::generic_category(), "epoll_ctl");
  accept_pending();
}

void Listener::close() {
  core_.poller.remove(token_);
  token_ = 0;
  fd_.reset();
}

void Listener::on_events(uint32_t) {
  accept_pending();
}

// Accepts until the backlog is empty (the next connection raises a new edge), a few hundred at
// a time so that the clients already in get served between turns.
void Listener::accept_pending() {
  constexpr int kPerTurn = 256;
  for (int i = 0; i < kPerTurn && fd_; ++i) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    sys::UniqueFd fd(::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd) {
      reported_ = false;
      tcp::endpoint peer;
      if (len <= peer.capacity()) {
        peer.resize(len);
        std::memcpy(peer.data(), &addr, len);
      }
      core_.serve(std::move(fd), peer);
      continue;
    }
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) return;
    if (err == EBADF || err == EINVAL || err == ENOTSOCK || err == EFAULT) return;  // closed
    const boost::system::error_code ec(err, boost::system::system_category());
    if (!sys::out_of_resources(ec)) continue;  // that one connection failed (e.g. reset)
    if (!reported_) {
      sys::log_line(core_.options.log_prefix,
                    "accept failed: " + sys::accept_failure_text(ec) +
                        "; new connections wait in the backlog until descriptors free up "
                        "(logged once until an accept succeeds)");
      reported_ = true;
    }
    // The pending connection stays in the backlog, and no new edge comes for it: retry after a
    // pause instead of spinning on it.
    core_.retry_timer.expires_after(std::chrono::milliseconds(50));
    core_.retry_timer.async_wait(
        [core = core_.shared_from_this()](const boost::system::error_code& timer_ec) {
          if (!timer_ec && !core->closed) core->listener.accept_pending();
        });
    return;
  }
  if (fd_) {
    asio::post(core_.io, [core = core_.shared_from_this()] {
      if (!core->closed) core->listener.accept_pending();
    });
  }
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
  listener.close();
  retry_timer.cancel();
  stall_timer.cancel();
  for (Connection* c = connections; c != nullptr; c = c->next_) c->close();
  poller.close();
  for (auto& [id, d] : detached) d.timer->cancel();
  detached.clear();
}

void ServerCore::park(std::unique_ptr<Session> session) {
  const uint64_t id = session->mux_id();
  session->detach(parked_listener);
  Detached d{std::move(session), std::make_unique<asio::steady_timer>(io)};
  d.timer->expires_after(options.mux_resume_timeout);
  d.timer->async_wait([weak = weak_from_this(), id](const boost::system::error_code& ec) {
    auto core = weak.lock();
    if (ec || !core) return;
    auto it = core->detached.find(id);
    if (it == core->detached.end()) return;
    std::unique_ptr<Session> gone = std::move(it->second.session);
    core->detached.erase(it);
    sys::log_line(core->options.log_prefix,
                  "a store proxy's session was not resumed within " +
                      std::to_string(core->options.mux_resume_timeout.count()) +
                      " ms: dropped with its parked waits");
    gone->discard_output();
    gone->fire_will();
  });
  detached[id] = std::move(d);
}

std::unique_ptr<Session> ServerCore::unpark(uint64_t id) {
  auto it = detached.find(id);
  if (it == detached.end()) return nullptr;
  std::unique_ptr<Session> session = std::move(it->second.session);
  it->second.timer->cancel();
  detached.erase(it);
  return session;
}

}  // namespace detail

Server::Server(asio::io_context& io, ServerOptions options)
    : core_(std::make_shared<detail::ServerCore>(io, std::move(options))) {
  const ServerOptions& opts = core_->options;
  std::string what = sys::endpoint_text(opts.host, opts.port);
  port_ = core_->listener.open(resolve(opts.host, opts.port),
                               opts.backlog > 0 ? opts.backlog : somaxconn(),
                               "cannot listen on " + what);
  core_->listener.start();  // before the wait that holds core_: a throw here leaks nothing
  core_->poller.start(core_);
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
