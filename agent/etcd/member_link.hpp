// What an EtcdClient and an EtcdWatch both hold: the options, the TLS context, the connection
// to the current member, and the failover state that picks the member (shared with the
// agent's other clients through Options::cursor), backs off once every member has failed and
// reports an outage and its end. Private to agent/etcd.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <optional>
#include <string>

#include "agent/etcd/connection.hpp"
#include "agent/etcd/etcd_client.hpp"

namespace ddprun::etcd::detail {

// One client's (or watch's) failover state: which member to try (shared through
// Options::cursor), back-off and outage reports.
class Members {
 public:
  // `o` must outlive this; no endpoints throws std::invalid_argument.
  Members(asio::any_io_executor ex, const Options& o);
  size_t index() const { return *at_ % o_.endpoints.size(); }
  const Endpoint& current() const { return o_.endpoints[index()]; }

  // Member `used` failed: move on (unless another client already did); after a whole cycle,
  // report and back off.
  asio::awaitable<void> failed(const std::string& what, Deadline deadline, size_t used);

  // A member answered: the back-off starts over, and an outage reported is reported ended.
  void succeeded();

  // The text of EtcdError(kUnavailable): the endpoints and the last error.
  std::string unavailable() const;

  void cancel() { timer_.cancel(); }

 private:
  const Options& o_;
  std::shared_ptr<size_t> at_;
  size_t tried_ = 0;
  Millis backoff_{20};
  std::optional<Clock::time_point> outage_since_;
  std::string last_error_;
  asio::steady_timer timer_;
};

// What a client and a watch both hold: the options, the TLS context, the failover state and
// the connection to the current member.
struct MemberLink {
  MemberLink(asio::any_io_executor ex, Options o);

  // Ends the request in progress and every later one.
  void close();

  asio::any_io_executor ex_;
  Options o_;
  std::unique_ptr<ssl::context> ctx_;
  Members members_;
  std::unique_ptr<Connection> conn_;
  bool closed_ = false;
};

}  // namespace ddprun::etcd::detail
