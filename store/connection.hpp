// One accepted client socket on the server's io_context. When the socket is readable it reads
// everything there is, until the kernel says "would block", into the server's one shared
// buffer (the io_context thread is its only user), feeds its Session and writes the replies
// with non-blocking sends, waiting for writability only when the peer is slow. An idle
// connection therefore holds no buffer and no coroutine frame: the object, the session and
// one pending readiness wait (whose handler owns the Connection through a shared_ptr). The
// ServerCore lists it so close() can reach it.
//
// Reading to "would block" before every wait is what makes the wait safe on asio's
// edge-triggered epoll reactor: data that arrives after that read raises a new edge.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>

#include "store/server_core.hpp"
#include "store/session.hpp"

namespace ddprun::store {

class Connection final : public std::enable_shared_from_this<Connection>, private OutputListener {
 public:
  // `peer` comes from accept(2), which still knows it when the client already reset.
  Connection(std::shared_ptr<detail::ServerCore> core, detail::ClientSocket socket,
             const boost::asio::ip::tcp::endpoint& peer);
  ~Connection();

  // Starts serving on the socket's executor.
  void start();
  // Closes the socket; the pending wait's handler then ends the connection.
  void close();

 private:
  friend struct detail::ServerCore;  // the intrusive list links

  // The socket is (or may be) readable: read and serve until it would block, then wait.
  void on_readable();
  void wait_readable();
  void wait_writable();
  // Ends the connection once: the refusal of a client that hung up on our proof, the close,
  // then the session's will.
  void finish();
  bool consume(const char* data, size_t size);
  void on_output() override { flush(true); }
  void on_keep_alive(int64_t interval_ms, uint32_t probes) override;
  void flush(bool arm);
  void arm_write();
  void arm_auth_deadline();
  void drop(const std::string& reason);
  // Logs the refusal (once, rate-limited) and closes; `send_queued`: replies first.
  void refuse(const char* reason, bool send_queued = false);
  std::string peer() const;

  // Declared first: destroyed last, after session_ has unparked from the store state.
  std::shared_ptr<detail::ServerCore> core_;
  detail::ClientSocket socket_;
  boost::asio::ip::tcp::endpoint peer_;
  Session session_;
  std::unique_ptr<boost::asio::steady_timer> auth_timer_;  // only while authenticating
  Connection* prev_ = nullptr;
  Connection* next_ = nullptr;
  bool closed_ = false;
  bool finished_ = false;
  bool write_armed_ = false;
  bool refusal_logged_ = false;
};

}  // namespace ddprun::store
