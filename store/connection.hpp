// One accepted client socket, on the server's Poller (edge-triggered). When the socket is
// readable it reads into the server's one shared buffer (the io_context thread is its only
// user), feeds its Session and writes the replies with non-blocking sends; output that does not
// fit waits for the socket's next "writable" edge. An idle connection therefore holds no buffer
// and no pending operation: the object, the session and a Poller slot. The ServerCore lists it
// so close() can reach it.
//
// Edge-triggered epoll reports new input once, so the input must be read up to "would block"
// before the next wait. A read that returns less than it asked for has emptied the socket (TCP
// copies whatever is queued), so it ends the turn without the extra read that would only say
// EAGAIN; unless the peer already shut down its side, whose end-of-file raised no new edge.
//
// Lifetime: the connection owns itself (self_) from start() until finish(), which hands that
// reference to a posted handler, so the object outlives the handler that ended it.
//
// Replies to the connection's own requests are sent as they are made. Output that another
// connection's request produced (its WAIT released by their SET) is sent by
// ServerCore::flush_deferred, after that request's handler.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>

#include "store/poller.hpp"
#include "store/server_core.hpp"
#include "store/session.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::store {

class Connection final : public std::enable_shared_from_this<Connection>,
                         private detail::PollHandler,
                         private OutputListener {
 public:
  // `fd`: accepted, non-blocking. `peer` comes from accept(2), which still knows it when the
  // client already reset.
  Connection(std::shared_ptr<detail::ServerCore> core, sys::UniqueFd fd,
             const boost::asio::ip::tcp::endpoint& peer);
  ~Connection();

  // Registers with the Poller and serves what the client already sent.
  void start();
  // Closes the socket; the connection ends (its session's will fires) in a posted handler.
  void close();

 private:
  friend struct detail::ServerCore;  // the intrusive list links

  void on_events(uint32_t events) override;
  // The socket is (or may be) readable: read and serve until it is empty.
  void on_readable();
  // Ends the connection once: the refusal of a client that hung up on our proof, the close,
  // then the session's will.
  void finish();
  // Closes the socket and leaves the Poller (no event reaches this connection after it).
  void shut();
  bool consume(const char* data, size_t size);
  // MUX asked to resume a detached session: this connection takes it over (from the
  // connection that still holds it, where its loss has not been seen yet).
  bool adopt(Session::ResumeRequest request);
  // Parks the multiplexed session for its proxy; an empty session takes its place here.
  void park_session();
  // Sends what it can and lets the paused session try its request again; false when the
  // connection was closed.
  bool resume();
  void on_output() override { core_->defer_flush(*this); }
  OutputListener& listener() { return *this; }
  void on_keep_alive(int64_t interval_ms, uint32_t probes) override;
  // Sends what the session has queued until it is sent or the socket is full. Returns 0, or
  // the errno of a failed send. Touches only this socket and this session's output, so a
  // FanOut helper may run it while the io_context thread waits.
  int send_queued();
  void flush();  // send_queued(), closing on failure
  void arm_auth_deadline();
  void drop(const std::string& reason);
  // Logs the refusal (once, rate-limited) and closes; `send_queued`: replies first.
  void refuse(const char* reason, bool send_queued = false);
  std::string peer() const;

  // Declared first: destroyed last, after session_ has unparked from the store state.
  std::shared_ptr<detail::ServerCore> core_;
  sys::UniqueFd fd_;
  boost::asio::ip::tcp::endpoint peer_;
  std::unique_ptr<Session> session_;  // replaced when a MUX resumes a detached session
  std::shared_ptr<Connection> self_;  // from start() until finish()
  std::unique_ptr<boost::asio::steady_timer> auth_timer_;  // only while authenticating
  detail::Poller::Token token_ = 0;
  Connection* prev_ = nullptr;
  Connection* next_ = nullptr;
  bool closed_ = false;
  bool finished_ = false;
  bool peer_shut_ = false;    // the peer's FIN (or an error) is known: read to the end
  bool read_paused_ = false;  // the session paused (a reply did not fit): see on_readable()
  bool refusal_logged_ = false;
  bool flush_deferred_ = false;  // listed in ServerCore::deferred
  bool budget_waiting_ = false;  // listed in ServerCore::budget_waiters
  // When the client last took reply bytes (or the connection started): ServerCore closes a
  // connection that holds budget and has not read for reply_stall_timeout while others wait.
  std::chrono::steady_clock::time_point last_sent_ = std::chrono::steady_clock::now();
};

}  // namespace ddprun::store
