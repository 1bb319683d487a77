// The server's own edge-triggered epoll set, nested in its io_context.
//
// Asio's reactor re-arms a descriptor with epoll_ctl(EPOLL_CTL_MOD) for every async_wait, and a
// connection that waits for readiness once per request pays that system call per request. The
// Poller registers each client socket (and the listening socket) once, for input, output and
// peer shutdown, edge-triggered, and is itself one descriptor the io_context waits on: one
// epoll_ctl per connection and one per batch of ready sockets, instead of one per request.
//
// Each registration is a slot with a generation, and epoll carries (generation, slot), not a
// pointer: an event that is already on its way when the handler is removed (the socket closed
// in the same batch, or still open in a forked child between fork and exec) finds a stale
// generation and is dropped. Single-threaded: every call on the io_context's thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <cstdint>
#include <memory>
#include <vector>

namespace ddprun::store::detail {

class PollHandler {
 public:
  // `events`: EPOLLIN / EPOLLOUT / EPOLLRDHUP / EPOLLHUP / EPOLLERR, as epoll reported them.
  virtual void on_events(uint32_t events) = 0;

 protected:
  ~PollHandler() = default;
};

class Poller {
 public:
  using Token = uint64_t;  // 0: not registered

  explicit Poller(boost::asio::io_context& io);  // throws std::system_error
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  // Watches `fd` (non-blocking) until remove(): events go to `handler`. 0 (errno set) on
  // failure.
  Token add(int fd, PollHandler& handler);
  // No event reaches the handler after this, even one already reported.
  void remove(Token token);
  // Starts waiting; each pending wait holds `owner` (whatever owns this Poller and the
  // handlers), so it outlives every event it dispatches.
  void start(std::shared_ptr<void> owner);
  // Stops waiting (idempotent). Registered handlers get no further events.
  void close();

 private:
  struct Slot {
    PollHandler* handler = nullptr;
    uint32_t generation = 1;
  };
  void wait(std::shared_ptr<void> owner);
  void dispatch();

  boost::asio::posix::stream_descriptor epoll_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  bool closed_ = false;
};

}  // namespace ddprun::store::detail
