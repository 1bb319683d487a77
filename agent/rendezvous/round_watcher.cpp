#include "agent/rendezvous/round_watcher.hpp"

#include <boost/asio/post.hpp>

#include "agent/rendezvous/round_protocol.hpp"

namespace ddprun::agent {

RoundWatcher::RoundWatcher(boost::asio::io_context& io, std::unique_ptr<PrefixClient> client,
                           Callback cb)
    : io_(io),
      client_(std::move(client)),
      callback_(std::move(cb)),
      alive_(std::make_shared<bool>(true)),
      thread_([this] { run(); }) {}

RoundWatcher::~RoundWatcher() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_one();
  client_->interrupt();
  thread_.join();
  *alive_ = false;
}

void RoundWatcher::watch(int round) {
  {
    std::lock_guard lock(mutex_);
    pending_ = round;
  }
  cv_.notify_one();
}

void RoundWatcher::run() {
  for (;;) {
    int round;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || pending_; });
      if (stop_) return;
      round = *pending_;
      pending_.reset();
    }
    std::optional<std::string> value;
    std::string error;
    try {
      const std::string key = RoundProtocol::key(round, "change");
      client_->wait({key}, Millis(0));  // no deadline: TCP keep-alive notices a dead store
      value = client_->get(key, Millis(0));
    } catch (const std::exception& e) {
      error = e.what();
    }
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
    }
    boost::asio::post(io_, [alive = std::weak_ptr<bool>(alive_), cb = callback_, round,
                            value = std::move(value), error = std::move(error)]() mutable {
      auto a = alive.lock();
      if (a && *a) cb(round, std::move(value), std::move(error));
    });
    if (!value) return;  // the connection is gone
  }
}

}  // namespace ddprun::agent
