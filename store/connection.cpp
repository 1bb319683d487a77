#include "store/connection.hpp"

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <cstring>

#include "store/sys/log.hpp"
#include "store/socket_io.hpp"

namespace ddprun::store {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);

// A client that sends without reading its replies is not read from while more than this is
// waiting to be sent to it.
constexpr size_t kHighWater = 4 << 20;
// Bytes read from one connection in one go before others get a turn.
constexpr size_t kMaxBurst = 1 << 20;

bool is_would_block(const boost::system::error_code& ec) {
  return ec == asio::error::would_block || ec == asio::error::try_again;
}

}  // namespace

Connection::Connection(std::shared_ptr<detail::ServerCore> core, tcp::socket socket,
                       const tcp::endpoint& peer)
    : core_(std::move(core)),
      socket_(std::move(socket)),
      peer_(peer),
      session_(core_->state, core_->options.limits, *this, core_->options.token) {
  core_->add(*this);
}

Connection::~Connection() {
  core_->remove(*this);
}

void Connection::start() {
  boost::system::error_code ec;
  socket_.set_option(tcp::no_delay(true), ec);
  socket_.non_blocking(true, ec);
  if (ec) return close();
  if (session_.authenticating()) arm_auth_deadline();
  asio::co_spawn(socket_.get_executor(), run(shared_from_this()), asio::detached);
}

// A store with a token does not let a stranger hold a connection open without proving itself.
void Connection::arm_auth_deadline() {
  auth_timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
  auth_timer_->expires_after(core_->options.auth_timeout);
  auth_timer_->async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec || self->closed_ || !self->session_.authenticating()) return;
    self->refuse("no token");
  });
}

void Connection::close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  socket_.close(ignored);
  if (auth_timer_) auth_timer_->cancel();
}

asio::awaitable<void> Connection::run(std::shared_ptr<Connection> self) {
  Connection& c = *self;
  while (!c.closed_) {
    auto [ec, n] = co_await c.socket_.async_read_some(asio::buffer(c.inbuf_), kUseTuple);
    if (ec) {
      if (ec == asio::error::eof) c.flush(false);  // a half-closed client still gets replies
      break;
    }
    if (!c.consume(c.inbuf_.data(), n)) break;
    if (n == c.inbuf_.size() && !c.drain_socket()) break;
    c.flush(true);
    while (!c.closed_ && c.session_.output().size() > kHighWater) {
      auto [wait_ec] = co_await c.socket_.async_wait(tcp::socket::wait_write, kUseTuple);
      if (wait_ec) break;
      c.flush(false);
    }
  }
  if (c.session_.challenged() && !c.core_->closed) c.refuse("wrong token");  // hung up on our proof
  c.close();
  c.session_.fire_will();  // after close(): the will's waiters may be anywhere but here
}

bool Connection::consume(const char* data, size_t size) {
  try {
    if (session_.feed(std::string_view(data, size))) return true;
    drop(session_.error());
  } catch (const std::exception& e) {  // e.g. bad_alloc on a huge multi-key request
    drop(std::string("internal error: ") + e.what());
  }
  return false;
}

// inbuf_ came back full: read the rest of the burst through the shared scratch buffer.
bool Connection::drain_socket() {
  size_t total = 0;
  while (!closed_ && total < kMaxBurst) {
    boost::system::error_code ec;
    size_t n = socket_.read_some(asio::buffer(core_->scratch.get(), core_->kScratchSize), ec);
    if (is_would_block(ec)) return true;
    if (ec) {
      if (ec == asio::error::eof) flush(false);
      return false;
    }
    if (!consume(core_->scratch.get(), n)) return false;
    total += n;
    if (n < core_->kScratchSize) return true;  // most likely drained: spare a syscall
  }
  return !closed_;
}

void Connection::flush(bool arm) {
  while (!closed_) {
    std::string_view out = session_.output();
    if (out.empty()) return;
    boost::system::error_code ec;
    size_t n = socket_.write_some(asio::buffer(out.data(), out.size()), ec);
    session_.consume_output(n);
    if (is_would_block(ec)) {
      if (arm && !write_armed_) arm_write();
      return;
    }
    if (ec) return close();  // peer gone: the read side ends the coroutine
  }
}

void Connection::on_keep_alive(int64_t interval_ms, uint32_t probes) {
  int n = static_cast<int>(std::min<uint32_t>(probes, 1000));
  if (!socket_io::set_keep_alive(socket_.native_handle(), std::chrono::milliseconds(interval_ms),
                                 n)) {
    sys::log_line(core_->options.log_prefix,
             "cannot enable keep-alive for " + peer() + ": " + std::strerror(errno));
  }
}

void Connection::arm_write() {
  write_armed_ = true;
  socket_.async_wait(tcp::socket::wait_write,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       self->write_armed_ = false;
                       if (!ec) self->flush(true);
                     });
}

void Connection::drop(const std::string& reason) {
  if (const char* why = session_.refused()) {
    // What the session queued goes out (kAuthRequiredWord for a PING: a client without a
    // token learns why), after the log line.
    return refuse(why, true);
  }
  sys::log_line(core_->options.log_prefix, "closing connection from " + peer() + " (" +
                                          dialect_name(session_.dialect()) + "): " + reason);
  close();
}

// A connection that did not authenticate: logged once (rate-limited), then closed.
void Connection::refuse(const char* reason, bool send_queued) {
  if (!refusal_logged_) core_->refusals.refused(peer(), reason);
  refusal_logged_ = true;
  if (send_queued) flush(false);
  close();
}

std::string Connection::peer() const {
  return detail::peer_text(peer_);
}

}  // namespace ddprun::store
