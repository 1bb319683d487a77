// The process's own stdout and stderr, written without ever blocking the caller.
//
// A console nobody reads (a stuck log shipper, a paused pager, ssh flow control) must not stop
// the agent: its loop serves the workers' store, heartbeats, /healthz and signals. So once a
// program attaches its io_context, every write to its stdout or stderr goes through a queue:
// what the destination takes at once is written at once, the rest when the destination becomes
// writable, on that io_context.
//
// When the reader falls behind (more than kMaxQueued bytes waiting for one destination):
//   - worker output (LineKind::kWorker: tee'd lines, the ssh fan-out's node lines) is dropped,
//     whole lines at a time, and counted; the log files are written elsewhere and stay complete;
//   - the program's own lines (log_line, the failure summary) are kept, up to kMaxQueued more;
//   - once the queue has drained, one line says how many lines were dropped.
// At exit, finish() gives the queue a bounded time to drain and then stops waiting for it.
//
// How a write avoids blocking without changing what others share: a pipe, FIFO or terminal is
// reopened through /proc/self/fd as a description of our own marked O_NONBLOCK (setting
// O_NONBLOCK on the inherited one would change it for the shell and any worker writing to the
// same terminal); a socket is written with MSG_DONTWAIT; a regular file is written directly
// (it does not wait for a reader). When stdout and stderr are the same pipe or terminal they
// share one queue, so their lines keep their order.
//
// Thread-safe: any thread may write. attach() and finish() are called by main().
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace ddprun::sys {

enum class LineKind { kOwn, kWorker };

struct ConsoleStats {
  uint64_t dropped_lines = 0;  // worker lines not shown on the console, since start
  uint64_t queued_bytes = 0;   // waiting for the console now, both streams
};

class Console {
 public:
  static constexpr size_t kMaxQueued = 4 << 20;

  // Writes `text` (whole lines) to `fd` (STDOUT_FILENO or STDERR_FILENO). Before attach() and
  // for any other fd: a plain blocking write.
  static void write(int fd, std::string_view text, LineKind kind);
  // From now on writes never block; queued output is written from `io`'s thread.
  static void attach(boost::asio::io_context& io);
  // Waits up to `limit` for queued output to be written, then stops using the io_context:
  // later writes are attempted once without blocking and dropped if the console takes none.
  static void finish(std::chrono::milliseconds limit);
  static ConsoleStats stats();
};

}  // namespace ddprun::sys
