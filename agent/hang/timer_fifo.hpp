// TimerFifo: one incarnation of the FIFO that torch's FileTimerClient writes to. A client opens
// it with O_WRONLY|O_NONBLOCK (ENXIO while nobody reads), writes one JSON line of at most
// PIPE_BUF bytes (atomic, so lines of different clients never interleave) and closes it.
//
// Construction replaces whatever is at the path with a new FIFO (mode 0600), opens it for
// reading and also holds a writer, so the reader never sees end-of-file between clients and
// readiness means data. Reading is event-driven on the io_context (async_read_some); the bytes
// are split into lines. After a read, the FIFO rests for `coalesce` before the next one, so
// requests arriving meanwhile are taken in one wake-up; whoever judges an expiry calls
// read_queued() first, so a release that is waiting in the pipe is never missed. A line longer than
// kMaxLine is reported once as too long and skipped up to its newline.
//
// Owns both descriptors and the FIFO's name (unlinked on destruction unless another FIFO has
// replaced it). A new attempt gets a new TimerFifo, so nothing an earlier attempt's workers
// wrote can leak into the next. io_context thread only; safe to destroy with a read pending.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/hang/owned_path.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent {

class TimerFifo {
 public:
  static constexpr size_t kMaxLine = 4096;
  // A complete line (without its '\n'), or, with too_long, the news that one was skipped.
  using LineCallback = std::function<void(std::string_view line, bool too_long)>;

  // Throws std::system_error naming the path (mkfifo or open failed).
  TimerFifo(boost::asio::io_context& io, const std::string& path, LineCallback on_line,
            std::chrono::milliseconds coalesce = std::chrono::milliseconds(0));
  ~TimerFifo();
  TimerFifo(const TimerFifo&) = delete;
  TimerFifo& operator=(const TimerFifo&) = delete;

  const std::string& path() const { return path_; }

  // Takes every request waiting in the pipe now, at once.
  void read_queued();

 private:
  void read();
  void feed(std::string_view data);

  std::string path_;
  OwnedPath name_;
  sys::UniqueFd writer_;  // never written: keeps the FIFO open between clients
  boost::asio::posix::stream_descriptor reader_;
  LineCallback on_line_;
  std::vector<char> buffer_;
  std::string partial_;    // the start of a line whose newline has not arrived yet
  bool skipping_ = false;  // inside a line already reported as too long
  std::chrono::milliseconds coalesce_;
  boost::asio::steady_timer rest_;
  sys::UniqueFd resting_;  // the reader while it rests, out of the reactor (no wake-ups)
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace ddprun::agent
