#include "store/connection.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>

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

// Bytes read from one connection in one go before others get a turn.
constexpr size_t kMaxBurst = 1 << 20;

}  // namespace

Connection::Connection(std::shared_ptr<detail::ServerCore> core, sys::UniqueFd fd,
                       const tcp::endpoint& peer)
    : core_(std::move(core)),
      fd_(std::move(fd)),
      peer_(peer),
      session_(std::make_unique<Session>(core_->state, core_->options.limits, listener(),
                                         core_->options.token, &core_->budget)) {
  core_->add(*this);
}

Connection::~Connection() {
  core_->poller.remove(token_);
  core_->remove(*this);
}

void Connection::start() {
  token_ = core_->poller.add(fd_.get(), *this);
  if (token_ == 0) {
    sys::log_line(core_->options.log_prefix,
                  "cannot serve " + peer() + ": epoll_ctl: " + std::strerror(errno));
    return;  // nothing holds the connection: it ends with the caller's reference
  }
  self_ = shared_from_this();
  if (session_->authenticating()) arm_auth_deadline();
  // The client may have sent its first request before the accept: read at once.
  on_readable();
}

// A store with a token does not let a stranger hold a connection open without proving itself.
void Connection::arm_auth_deadline() {
  auth_timer_ = std::make_unique<asio::steady_timer>(core_->io);
  auth_timer_->expires_after(core_->options.auth_timeout);
  auth_timer_->async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec || self->closed_ || !self->session_->authenticating()) return;
    self->refuse("no token");
  });
}

void Connection::close() {
  if (closed_) return;
  shut();
  // Not finish() here: close() runs inside other work (the server closing every connection,
  // the allow-list narrowing, a deferred flush), which the will must not change under it.
  asio::post(core_->io, [self = shared_from_this()] { self->finish(); });
}

void Connection::shut() {
  closed_ = true;
  core_->poller.remove(token_);
  token_ = 0;
  fd_.reset();
  if (auth_timer_) auth_timer_->cancel();
}

void Connection::on_events(uint32_t events) {
  if (closed_) return;
  if (events & EPOLLOUT) flush();
  if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) peer_shut_ = true;
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) || read_paused_) on_readable();
}

void Connection::on_readable() {
  read_paused_ = false;
  size_t total = 0;
  char* buffer = core_->scratch.get();
  while (!closed_) {
    if (session_->paused()) {
      // A reply did not fit: nothing more is read until it does.
      const uint64_t handled = session_->requests_handled();
      if (!resume()) break;
      if (!session_->paused()) continue;  // the socket may hold more: read on
      // Its own replies went out whole: room again here, try once more.
      if (session_->output().empty() && session_->requests_handled() != handled) continue;
      read_paused_ = true;
      // Else what resumes it: the socket's "writable" edge (it is full), the release of the
      // WAIT that holds replies back (ServerCore::flush_deferred), or, with nothing queued
      // here, budget that other connections give back.
      if (session_->output().empty() && !session_->waiting()) core_->wait_for_budget(*this);
      return;
    }
    const ssize_t n = ::recv(fd_.get(), buffer, core_->kScratchSize, 0);
    if (n > 0) {
      if (!consume(buffer, static_cast<size_t>(n))) break;
      flush();
      if (session_->paused()) continue;
      if (static_cast<size_t>(n) < core_->kScratchSize && !peer_shut_) return;  // emptied
      total += static_cast<size_t>(n);
      if (total >= kMaxBurst) {  // others get a turn before this client's next megabyte
        asio::post(core_->io, [self = shared_from_this()] {
          if (!self->closed_) self->on_readable();
        });
        return;
      }
      continue;
    }
    if (n == 0) {
      flush();  // a half-closed client still gets its replies
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    break;  // reset or another error
  }
  finish();
}

void Connection::finish() {
  if (finished_) return;
  finished_ = true;
  if (session_->challenged() && !core_->closed) refuse("wrong token");  // hung up on our proof
  if (!closed_) shut();
  if (session_->mux_id() != 0 && !core_->closed) park_session();
  session_->discard_output();  // its budget goes to the connections that wait for it
  core_->wake_budget_waiters();
  session_->fire_will();  // after the close: the will's waiters may be anywhere but here
  // The handler that called this may still use the object: release it after that handler.
  if (self_) asio::post(core_->io, [self = std::move(self_)] {});
}

// A proxy's multiplexed session waits for its proxy to come back (PROTOCOL.md, "Resuming a
// multiplexed connection"); an empty one stands in here until the object goes.
void Connection::park_session() {
  core_->park(std::move(session_));
  session_ = std::make_unique<Session>(core_->state, core_->options.limits, listener(),
                                       core_->options.token, &core_->budget);
}

bool Connection::consume(const char* data, size_t size) {
  try {
    if (session_->feed(std::string_view(data, size))) {
      if (auto resume = session_->take_resume_request()) return adopt(std::move(*resume));
      return true;
    }
    drop(session_->error());
  } catch (const std::exception& e) {  // e.g. bad_alloc on a huge multi-key request
    drop(std::string("internal error: ") + e.what());
  }
  return false;
}

bool Connection::adopt(Session::ResumeRequest request) {
  flush();  // the hello's PING echo, before the resumed stream
  if (closed_) return false;
  std::unique_ptr<Session> parked = core_->unpark(request.id);
  if (!parked && request.id != 0) {
    // Its proxy may have moved on from a connection whose loss this store has not seen yet (a
    // reset both ways, this connection's bytes handled first): that one lets the session go.
    for (Connection* c = core_->connections; c != nullptr; c = c->next_) {
      if (c == this || c->session_->mux_id() != request.id) continue;
      sys::log_line(core_->options.log_prefix, "closing connection from " + c->peer() +
                                                   ": its session is resumed from " + peer());
      c->park_session();
      c->close();
      parked = core_->unpark(request.id);
      break;
    }
  }
  if (!parked) {
    const char unknown = static_cast<char>(kMuxUnknownSession);  // the proxy stops trying
    (void)::send(fd_.get(), &unknown, 1, MSG_NOSIGNAL);
    drop("MUX resumes session " + std::to_string(request.id) +
         ", which this store does not have (expired, or never made)");
    return false;
  }
  if (!parked->attach(listener(), request.received)) {
    drop("MUX resumes session " + std::to_string(request.id) + " from stream position " +
         std::to_string(request.received) + ", which it cannot resume from");
    return false;
  }
  session_ = std::move(parked);
  if (request.rest.empty()) return true;
  return consume(request.rest.data(), request.rest.size());
}

bool Connection::resume() {
  flush();  // what fits in the socket leaves first, making room
  if (closed_) return false;
  try {
    if (session_->resume()) {
      flush();
      return !closed_;
    }
    drop(session_->error());
  } catch (const std::exception& e) {
    drop(std::string("internal error: ") + e.what());
  }
  return false;
}

// A full socket raises a "writable" edge once it drains, which sends the rest.
int Connection::send_queued() {
  while (!closed_) {
    std::string_view out = session_->output();
    if (out.empty()) return 0;
    const ssize_t n = ::send(fd_.get(), out.data(), out.size(), MSG_NOSIGNAL);
    if (n >= 0) {
      if (n > 0) last_sent_ = std::chrono::steady_clock::now();
      session_->consume_output(static_cast<size_t>(n));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return errno;
  }
  return 0;
}

void Connection::flush() {
  if (send_queued() != 0) close();  // the peer is gone
  core_->wake_budget_waiters();     // what was sent gave budget back
}

void Connection::on_keep_alive(int64_t interval_ms, uint32_t probes) {
  if (closed_) return;
  int n = static_cast<int>(std::min<uint32_t>(probes, 1000));
  if (!socket_io::set_keep_alive(fd_.get(), std::chrono::milliseconds(interval_ms), n)) {
    sys::log_line(core_->options.log_prefix,
                  "cannot enable keep-alive for " + peer() + ": " + std::strerror(errno));
  }
}

void Connection::drop(const std::string& reason) {
  if (const char* why = session_->refused()) {
    // What the session queued goes out (kAuthRequiredWord for a PING: a client without a
    // token learns why), after the log line.
    return refuse(why, true);
  }
  sys::log_line(core_->options.log_prefix, "closing connection from " + peer() + " (" +
                                               dialect_name(session_->dialect()) + "): " + reason);
  close();
}

// A connection that did not authenticate: logged once (rate-limited), then closed.
void Connection::refuse(const char* reason, bool send_queued) {
  if (!refusal_logged_) core_->refusals.refused(peer(), reason);
  refusal_logged_ = true;
  if (send_queued) flush();
  close();
}

std::string Connection::peer() const {
  return detail::peer_text(peer_);
}

}  // namespace ddprun::store
