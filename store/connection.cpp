#include "store/connection.hpp"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>

#include "store/socket_io.hpp"
#include "store/sys/log.hpp"

namespace ddprun::store {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

// A client that sends without reading its replies is not read from while more than this is
// waiting to be sent to it.
constexpr size_t kHighWater = 4 << 20;
// Bytes read from one connection in one go before others get a turn.
constexpr size_t kMaxBurst = 1 << 20;

bool is_would_block(const boost::system::error_code& ec) {
  return ec == asio::error::would_block || ec == asio::error::try_again;
}

}  // namespace

Connection::Connection(std::shared_ptr<detail::ServerCore> core, detail::ClientSocket socket,
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
  // The client may have sent its first request before the accept: read at once.
  on_readable();
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

void Connection::on_readable() {
  size_t total = 0;
  while (!closed_) {
    if (session_.output().size() > kHighWater) return wait_writable();
    boost::system::error_code ec;
    size_t n = socket_.read_some(asio::buffer(core_->scratch.get(), core_->kScratchSize), ec);
    if (is_would_block(ec)) return wait_readable();
    if (ec) {
      if (ec == asio::error::eof) flush(false);  // a half-closed client still gets replies
      break;
    }
    if (!consume(core_->scratch.get(), n)) break;
    flush(true);
    total += n;
    if (total >= kMaxBurst) {  // others get a turn before this client's next megabyte
      asio::post(socket_.get_executor(), [self = shared_from_this()] { self->on_readable(); });
      return;
    }
  }
  finish();
}

void Connection::wait_readable() {
  socket_.async_wait(tcp::socket::wait_read,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       if (ec || self->closed_) return self->finish();
                       self->on_readable();
                     });
}

// A client that sends without reading its replies is not read from until they drain.
void Connection::wait_writable() {
  socket_.async_wait(tcp::socket::wait_write,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       if (ec || self->closed_) return self->finish();
                       self->flush(false);
                       self->on_readable();  // waits again while still over the mark
                     });
}

void Connection::finish() {
  if (finished_) return;
  finished_ = true;
  if (session_.challenged() && !core_->closed) refuse("wrong token");  // hung up on our proof
  close();
  session_.fire_will();  // after close(): the will's waiters may be anywhere but here
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
