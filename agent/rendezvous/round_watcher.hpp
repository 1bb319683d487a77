// RoundWatcher: a thread parked in WAIT on the running round's "change" key, on a connection
// of its own, so that any event that ends the round (a node joined, died or failed, or all
// finished) reaches this agent the moment it is written, with one WAIT per agent and no
// polling. Losing that connection means losing the store, which is reported the same way.
//
// Threads: construct, watch() and destroy on the agent's io_context thread; the callback is
// posted to that io_context. The destructor interrupts the wait and joins the thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "agent/rendezvous/prefix_client.hpp"

namespace ddprun::agent {

class RoundWatcher {
 public:
  // value: the key's value; or nullopt and `error` when the store connection was lost.
  using Callback =
      std::function<void(int round, std::optional<std::string> value, std::string error)>;

  RoundWatcher(boost::asio::io_context& io, std::unique_ptr<PrefixClient> client, Callback cb);
  ~RoundWatcher();
  RoundWatcher(const RoundWatcher&) = delete;
  RoundWatcher& operator=(const RoundWatcher&) = delete;

  // Starts waiting for round `round`'s change key (after the previous wait ended).
  void watch(int round);

 private:
  void run();

  boost::asio::io_context& io_;
  std::unique_ptr<PrefixClient> client_;
  Callback callback_;
  std::shared_ptr<bool> alive_;  // posted callbacks check it: the watcher may be gone
  std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<int> pending_;
  bool stop_ = false;
  std::thread thread_;  // last: started after everything it uses
};

}  // namespace ddprun::agent
