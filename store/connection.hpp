// One accepted client socket on the server's io_context: reads into a small buffer (a
// burst spills into the server's shared scratch buffer), feeds its Session and writes the
// replies with non-blocking sends, waiting for writability only when the peer is slow.
// Owned by its own coroutine (shared_ptr); the ServerCore lists it so close() can reach it.
#pragma once

#include <array>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>

#include "store/server_core.hpp"
#include "store/session.hpp"

namespace ddprun::store {

class Connection final : public std::enable_shared_from_this<Connection>, private OutputListener {
 public:
  // `peer` comes from accept(2), which still knows it when the client already reset.
  Connection(std::shared_ptr<detail::ServerCore> core, boost::asio::ip::tcp::socket socket,
             const boost::asio::ip::tcp::endpoint& peer);
  ~Connection();

  // Starts serving on the socket's executor.
  void start();
  // Closes the socket; the coroutine ends on its next resumption.
  void close();

 private:
  friend struct detail::ServerCore;  // the intrusive list links

  static boost::asio::awaitable<void> run(std::shared_ptr<Connection> self);
  bool consume(const char* data, size_t size);
  bool drain_socket();
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
  boost::asio::ip::tcp::socket socket_;
  boost::asio::ip::tcp::endpoint peer_;
  Session session_;
  std::unique_ptr<boost::asio::steady_timer> auth_timer_;  // only while authenticating
  Connection* prev_ = nullptr;
  Connection* next_ = nullptr;
  bool closed_ = false;
  bool write_armed_ = false;
  bool refusal_logged_ = false;
  std::array<char, 512> inbuf_;
};

}  // namespace ddprun::store
