#include "store/poller.hpp"

#include <sys/epoll.h>

#include <cerrno>
#include <system_error>

namespace ddprun::store::detail {
namespace {

namespace asio = boost::asio;

// Ready sockets handled per turn of the io_context; more wait for the next turn.
constexpr int kBatch = 256;
constexpr int kRounds = 4;

int open_epoll() {
  int fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
  return fd;
}

}  // namespace

Poller::Poller(asio::io_context& io) : epoll_(io, open_epoll()) {}

Poller::Token Poller::add(int fd, PollHandler& handler) {
  uint32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    index = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Slot& slot = slots_[index];
  const Token token = (static_cast<Token>(slot.generation) << 32) | index;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.u64 = token;
  if (::epoll_ctl(epoll_.native_handle(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    free_.push_back(index);
    return 0;
  }
  slot.handler = &handler;
  return token;
}

void Poller::remove(Token token) {
  const auto index = static_cast<uint32_t>(token);
  if (token == 0 || index >= slots_.size()) return;
  Slot& slot = slots_[index];
  if (slot.generation != static_cast<uint32_t>(token >> 32)) return;
  slot.handler = nullptr;
  if (++slot.generation == 0) slot.generation = 1;  // a token is never 0
  free_.push_back(index);
}

void Poller::start(std::shared_ptr<void> owner) {
  wait(std::move(owner));
}

void Poller::close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  epoll_.cancel(ignored);
}

void Poller::wait(std::shared_ptr<void> owner) {
  epoll_.async_wait(asio::posix::stream_descriptor::wait_read,
                    [this, owner](const boost::system::error_code& ec) mutable {
                      if (ec || closed_) return;
                      dispatch();
                      if (!closed_) wait(std::move(owner));
                    });
}

void Poller::dispatch() {
  epoll_event events[kBatch];
  // Events that arrive while a batch is handled are taken in the same turn, a few rounds at
  // most: each round saved is a re-arm and a wait on the io_context's own epoll set.
  for (int round = 0; round < kRounds && !closed_; ++round) {
    int n;
    do {
      n = ::epoll_wait(epoll_.native_handle(), events, kBatch, 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return;
    for (int i = 0; i < n && !closed_; ++i) {
      const Token token = events[i].data.u64;
      const auto index = static_cast<uint32_t>(token);
      if (index >= slots_.size()) continue;
      const Slot& slot = slots_[index];
      if (slot.generation != static_cast<uint32_t>(token >> 32) || slot.handler == nullptr) {
        continue;  // removed since epoll reported it
      }
      slot.handler->on_events(events[i].events);
    }
  }
}

}  // namespace ddprun::store::detail
