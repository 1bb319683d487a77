// The store proxy's one connection to the job's store (proxy.hpp), in multiplexed mode
// (PROTOCOL.md, "Multiplexed connections"): requests are written as they come, batched into one
// write per turn of the io_context; replies arrive framed, the ordered ones matched to the
// requests in order, the releases of tagged waits by tag. Internal to store/.
//
// Threads: the io_context thread only.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "store/proxy.hpp"

namespace ddprun::store::proxy {

// How a reply is laid out, to find where it ends.
enum class Shape : uint8_t { kU8, kI64, kBytes, kValues, kQueuePop, kListKeys };

// The length of the complete reply of `shape` at the front of `in` (kValues: `count` values),
// or 0 while it is incomplete. Throws std::length_error for a length no store would send.
size_t reply_length(Shape shape, size_t count, std::string_view in);

class Upstream : public std::enable_shared_from_this<Upstream> {
 public:
  // An ordered reply: its bytes as the store sent them (without the frame byte), or, when the
  // store refused the request (kMuxFailed), `failed` and the reason.
  using Reply = std::function<void(std::string_view reply, bool failed)>;
  struct Handlers {
    std::function<void(uint32_t tag)> released;                            // a tagged wait's
    std::function<void(uint32_t tag, const std::string& why)> tag_failed;  // a tagged barrier's
    std::function<void(const std::string& why)> lost;  // cannot connect, or the link broke
    std::function<void()> connected;
  };

  Upstream(boost::asio::any_io_executor executor, const ProxyOptions& options, Handlers handlers);
  void start();  // connects (with the client's retries), then sends what is queued
  void close();

  // Queues a request whose reply comes in order.
  void send(std::string frame, Shape shape, size_t count, Reply reply);
  // Queues a request that has no ordered reply (SET, a tagged wait, ...).
  void send(std::string frame);
  // Writes what was queued (one write for everything queued since the last).
  void flush();

  bool connected() const { return connected_; }
  uint64_t requests() const { return requests_; }

 private:
  struct Expected {
    Shape shape;
    size_t count;
    Reply reply;
  };
  boost::asio::awaitable<void> connect();
  void read();
  bool parse();  // false: a malformed stream (the link is lost)
  void fail(const std::string& why);

  boost::asio::any_io_executor executor_;
  ProxyOptions options_;
  Handlers handlers_;
  boost::asio::ip::tcp::socket socket_;
  std::string out_;      // queued, not yet being written
  std::string writing_;  // being written
  std::string in_;       // received, not yet parsed
  std::deque<Expected> expected_;
  uint64_t requests_ = 0;
  bool connected_ = false;
  bool writing_now_ = false;
  bool closed_ = false;
};

}  // namespace ddprun::store::proxy
