#include "store/sys/console.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <memory>
#include <mutex>
#include <string>

#include "store/sys/fd.hpp"
#include "store/sys/log.hpp"

namespace ddprun::sys {
namespace {

namespace asio = boost::asio;

// How a destination is written: kBlocking for a regular file (it never waits for a reader) or
// when no private non-blocking description could be had; kNonBlocking for a reopened pipe,
// FIFO or terminal; kSocket for a socket (MSG_DONTWAIT).
enum class Mode { kBlocking, kNonBlocking, kSocket };

struct Sink {
  int fd = -1;
  UniqueFd own;  // the reopened description, when `fd` is it and `watch` does not hold it
  Mode mode = Mode::kBlocking;
  std::string queue;
  size_t pos = 0;           // queue[pos..] is still to be written
  uint64_t unreported = 0;  // worker lines dropped since the last notice
  bool broken = false;      // a write failed for good (the reader is gone): nothing more goes
  bool armed = false;       // a "writable" wait is pending
  std::unique_ptr<asio::posix::stream_descriptor> watch;  // a duplicate of fd, for the wait
  size_t queued() const { return queue.size() - pos; }
};

struct State {
  std::mutex mu;
  asio::io_context* io = nullptr;
  bool finished = false;
  Sink sinks[2];
  Sink* route[3] = {nullptr, &sinks[0], &sinks[1]};  // by fd; stderr may share stdout's sink
  uint64_t dropped = 0;
};

// Never destroyed: the last lines of a process (and of its threads) are written during exit.
State& state() {
  static State* s = new State;
  return *s;
}

size_t count_lines(std::string_view text) {
  return std::max<size_t>(1, static_cast<size_t>(std::count(text.begin(), text.end(), '\n')));
}

// Writes what the destination takes now. Returns the bytes written; sets `broken` when the
// destination failed for good.
size_t write_now(Sink& s, std::string_view text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = s.mode == Mode::kSocket ? ::send(s.fd, text.data() + done, text.size() - done,
                                                 MSG_DONTWAIT | MSG_NOSIGNAL)
                                        : ::write(s.fd, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    s.broken = true;  // EPIPE, EIO, ...: nobody will read what follows
    s.queue.clear();
    s.pos = 0;
    break;
  }
  return done;
}

void append(Sink& s, std::string_view text) {
  if (s.pos > 0 && s.pos >= s.queue.size() / 2) {  // keep the queue compact
    s.queue.erase(0, s.pos);
    s.pos = 0;
  }
  s.queue.append(text);
}

std::string dropped_notice(uint64_t lines) {
  return "[ddprun] " + host_name() + ":" + std::to_string(::getpid()) +
         " console: " + std::to_string(lines) +
         " line(s) of worker output were not shown here because this output was not being read; "
         "the log files have every line\n";
}

void arm(State& st, Sink& s);

// On the io_context's thread: the destination is writable (or the wait ended).
void on_writable(Sink& s) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  s.armed = false;
  if (!st.io || s.broken) return;
  s.pos += write_now(s, std::string_view(s.queue).substr(s.pos));
  if (s.queued() == 0 && s.unreported > 0 && !s.broken) {
    append(s, dropped_notice(s.unreported));
    s.unreported = 0;
    s.pos += write_now(s, std::string_view(s.queue).substr(s.pos));
  }
  if (s.queued() == 0) {
    s.queue.clear();
    s.pos = 0;
    if (s.queue.capacity() > (64 << 10)) std::string().swap(s.queue);
  } else {
    arm(st, s);
  }
}

// Under st.mu: asks the io_context to call on_writable when the destination can take more.
void arm(State& st, Sink& s) {
  if (s.armed || !st.io || !s.watch) return;
  s.armed = true;
  asio::post(*st.io, [&s] {
    State& st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    if (!st.io || !s.watch) {
      s.armed = false;
      return;
    }
    s.watch->async_wait(asio::posix::stream_descriptor::wait_write,
                        [&s](const boost::system::error_code&) { on_writable(s); });
  });
}

void set_up(State& st, Sink& s, int fd, const struct stat& info, bool stat_ok) {
  s.fd = fd;
  s.mode = Mode::kBlocking;
  if (!stat_ok || S_ISREG(info.st_mode)) return;
  if (S_ISSOCK(info.st_mode)) {
    s.mode = Mode::kSocket;
  } else {
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    int own = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (own < 0) return;  // no /proc, or a pipe without a reader: as before, blocking
    s.own.reset(own);
    s.fd = own;
    s.mode = Mode::kNonBlocking;
  }
  // The wait for "writable" needs the descriptor in an Asio object: ours (the reopened one)
  // goes there, released again in finish(); a socket's is shared with everyone, so a duplicate.
  const int watch = s.own ? s.own.release() : ::fcntl(s.fd, F_DUPFD_CLOEXEC, 3);
  if (watch >= 0) s.watch = std::make_unique<asio::posix::stream_descriptor>(*st.io, watch);
}

}  // namespace

void Console::write(int fd, std::string_view text, LineKind kind) {
  if (text.empty()) return;
  State& st = state();
  std::unique_lock<std::mutex> lock(st.mu);
  Sink* s = fd == 1 || fd == 2 ? st.route[fd] : nullptr;
  if ((!st.io && !st.finished) || !s || s->mode == Mode::kBlocking) {
    lock.unlock();
    write_all(s && s->fd >= 0 ? s->fd : fd, text.data(), text.size());
    return;
  }
  if (s->broken) return;
  if (s->queued() == 0) {
    const size_t n = write_now(*s, text);
    text.remove_prefix(n);
    if (text.empty() || s->broken) return;
    if (n > 0 && !st.finished) {  // a line already begun goes out whole, whatever is queued
      append(*s, text);
      arm(st, *s);
      return;
    }
  }
  const size_t limit = kind == LineKind::kWorker ? kMaxQueued : 2 * kMaxQueued;
  if (st.finished || s->queued() + text.size() > limit) {
    const size_t lines = count_lines(text);
    if (kind == LineKind::kWorker) {
      s->unreported += lines;
      st.dropped += lines;
    }
    return;
  }
  append(*s, text);
  arm(st, *s);
}

void Console::attach(asio::io_context& io) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.io || st.finished) return;
  st.io = &io;
  struct stat out {
  }, err{};
  const bool out_ok = ::fstat(1, &out) == 0, err_ok = ::fstat(2, &err) == 0;
  set_up(st, st.sinks[0], 1, out, out_ok);
  if (out_ok && err_ok && !S_ISREG(out.st_mode) && out.st_dev == err.st_dev &&
      out.st_ino == err.st_ino) {
    st.route[2] = &st.sinks[0];  // one pipe or terminal: one queue keeps the lines in order
  } else {
    set_up(st, st.sinks[1], 2, err, err_ok);
  }
}

void Console::finish(std::chrono::milliseconds limit) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (!st.io) return;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (Sink& s : st.sinks) {
    while (s.queued() > 0 && !s.broken) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      struct pollfd p {
        s.fd, POLLOUT, 0
      };
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      s.pos += write_now(s, std::string_view(s.queue).substr(s.pos));
    }
    if (s.queued() == 0 && s.unreported > 0 && !s.broken) {
      write_now(s, dropped_notice(s.unreported));
      s.unreported = 0;
    }
    s.queue.clear();
    s.pos = 0;
    if (s.watch && s.mode == Mode::kNonBlocking) {
      boost::system::error_code ignored;
      s.watch->cancel(ignored);
      s.own.reset(s.watch->release());  // still ours to write to after the io_context goes
    }
    s.watch.reset();  // before the io_context goes
    s.armed = false;
  }
  st.io = nullptr;
  st.finished = true;
}

ConsoleStats Console::stats() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  ConsoleStats out;
  out.dropped_lines = st.dropped;
  out.queued_bytes = st.sinks[0].queued() + st.sinks[1].queued();
  return out;
}

}  // namespace ddprun::sys
