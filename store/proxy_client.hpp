// One worker's connection to the store proxy (proxy.hpp): its socket, the parser of its
// requests (either dialect), the requests not yet issued, and the replies it is owed, in
// request order. Replies are slots filled as answers arrive (from upstream, or at once) and
// sent strictly in order. The proxy decides what each request becomes (proxy.cpp). Internal to
// store/.
//
// Threads: the io_context thread only.
#pragma once

#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "store/frame_parser.hpp"
#include "store/protocol.hpp"

namespace ddprun::store::proxy {

class LocalClient;

// A reply owed to a client. Filled once; a dropped one (a WAIT cancelled) sends nothing.
struct Slot {
  std::weak_ptr<LocalClient> client;
  std::string bytes;
  bool ready = false;
  void fill(std::string_view reply);
  void drop() { fill({}); }
};

class LocalClient : public std::enable_shared_from_this<LocalClient> {
 public:
  // Each parsed request, in order, when the client is not blocked (see block()).
  using Issue = std::function<void(LocalClient&, Request&)>;
  using Closed = std::function<void(LocalClient&, const std::string& why)>;  // why: "" if normal

  LocalClient(boost::asio::ip::tcp::socket socket, const Limits& limits, std::string peer);
  void start(Issue issue, Closed closed);
  // Ends the connection (queued replies are not sent); `why` is logged when not empty.
  void close(const std::string& why);
  bool closed() const { return closed_; }

  // A slot for the reply of the request being issued, in order.
  std::shared_ptr<Slot> owe();
  // Sends what is ready, in order (called when a slot is filled).
  void send_ready();

  // While blocked, requests stay queued (a coalesced request waits to be sent upstream, and the
  // client's later requests must not overtake it). unblock() issues the queued ones.
  void block() { blocked_ = true; }
  void unblock();
  bool blocked() const { return blocked_; }

  Dialect dialect() const { return parser_.dialect(); }
  const std::string& peer() const { return peer_; }

  // The client's WAIT or BARRIER that has not been answered (at most one), for CANCEL_WAIT and
  // 1.13's "a new request cancels it". `cancel` undoes it upstream (or in the group it joined).
  struct PendingWait {
    std::shared_ptr<Slot> slot;
    std::function<void()> cancel;
  };
  std::optional<PendingWait>& pending_wait() { return wait_; }

  // SET_WILL: applied upstream as a COMPARE_SET when the connection ends.
  struct Will {
    std::string key, expected, desired;
  };
  std::optional<Will>& will() { return will_; }

 private:
  void read();
  void write();
  void issue_queued();

  boost::asio::ip::tcp::socket socket_;
  FrameParser parser_;
  std::string peer_;
  Issue issue_;
  Closed closed_callback_;
  std::array<char, 16 << 10> in_{};
  std::deque<Request> queued_;
  std::deque<std::shared_ptr<Slot>> owed_;
  std::string out_;
  std::string writing_;
  std::optional<PendingWait> wait_;
  std::optional<Will> will_;
  bool blocked_ = false;
  bool issuing_ = false;
  bool writing_now_ = false;
  bool closed_ = false;
};

}  // namespace ddprun::store::proxy
