// The store proxy's one connection to the job's store (proxy.hpp), in multiplexed mode
// (PROTOCOL.md, "Multiplexed connections"): requests are written as they come, batched into one
// write per turn of the io_context; replies arrive framed, the ordered ones matched to the
// requests in order, the releases of tagged waits by tag.
//
// When the connection breaks, it connects again and resumes its session on the store: it says
// how much of the store's output it has, the store says how much of its requests it has, and
// each side sends the rest. Requests are kept until the store confirms it has them (MUX_SYNC),
// so nothing is lost or applied twice. Only when the session cannot be resumed (the store is
// gone, restarted, or kept it past its resume timeout) is the link lost. Internal to store/.
//
// Threads: the io_context thread only.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
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
  void start();  // connects (retried as a resume is), then sends what is queued
  void close();

  // Queues a request whose reply comes in order.
  void send(std::string frame, Shape shape, size_t count, Reply reply);
  // Queues a request that has no ordered reply (SET, a tagged wait, ...).
  void send(std::string frame);
  // Writes what was queued (one write for everything queued since the last).
  void flush();

  bool connected() const { return connected_; }
  uint64_t requests() const { return requests_; }
  uint64_t resumes() const { return resumes_; }

 private:
  struct Expected {
    Shape shape;
    size_t count;
    Reply reply;
  };
  // Connects (retrying for `budget`) and opens (session 0) or resumes the session.
  boost::asio::awaitable<void> connect(std::chrono::milliseconds budget);
  boost::asio::awaitable<void> resume();
  void read();
  bool parse();                         // false: a malformed stream (the link is lost)
  void fail(const std::string& why);    // the link is lost for good
  void broken(const std::string& why);  // the connection broke: resume
  void sync_if_due();

  boost::asio::any_io_executor executor_;
  ProxyOptions options_;
  Handlers handlers_;
  boost::asio::ip::tcp::socket socket_;
  boost::asio::cancellation_signal cancel_;  // close(): ends a connect or resume in progress
  std::string out_;                          // queued, not yet written
  // Written, not yet confirmed by the store: request stream bytes from sent_base_ on.
  std::string sent_;
  uint64_t sent_base_ = 0;
  static constexpr size_t kReadChunk = 64 << 10;
  std::unique_ptr<char[]> chunk_;  // what one read fills, appended to in_
  std::string in_;                 // received, not yet parsed
  uint64_t in_total_ = 0;          // stream bytes received from the store
  uint64_t synced_in_ = 0;         // in_total_ as the last MUX_SYNC told it
  std::deque<Expected> expected_;
  uint64_t session_ = 0;     // the store's id of this proxy's session (0: none yet)
  uint64_t generation_ = 0;  // bumped when a connection breaks: its handlers are stale
  uint64_t requests_ = 0;
  uint64_t resumes_ = 0;
  bool connected_ = false;
  bool writing_now_ = false;
  bool sync_pending_ = false;
  bool closed_ = false;
};

}  // namespace ddprun::store::proxy
