// Wakeup (Boost.Asio, header-only): a one-waiter event for coroutines on a single-threaded
// io_context. notify() wakes the waiter (or the next wait() if none is waiting); wait_until() also
// ends at a deadline. This is how worker exits and signals reach the agent loop without polling.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>

namespace ddprun::sys {

class Wakeup {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Wakeup(const boost::asio::any_io_executor& executor) : timer_(executor) {}

  void notify() {
    pending_ = true;
    timer_.cancel();
  }

  // True when notified, false when the deadline passed first.
  boost::asio::awaitable<bool> wait_until(Clock::time_point deadline) {
    while (!pending_) {
      timer_.expires_at(deadline);
      boost::system::error_code ec;
      co_await timer_.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
      if (!ec && !pending_) co_return false;
    }
    pending_ = false;
    co_return true;
  }

  boost::asio::awaitable<void> wait() { co_await wait_until(Clock::time_point::max()); }

 private:
  boost::asio::steady_timer timer_;
  bool pending_ = false;
};

}  // namespace ddprun::sys
