#include "agent/hang/timer_fifo.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "store/sys/log.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;

namespace {

[[noreturn]] void fail(int error, const std::string& what) {
  throw std::system_error(error, std::generic_category(), what);
}

}  // namespace

TimerFifo::TimerFifo(asio::io_context& io, const std::string& path, LineCallback on_line,
                     std::chrono::milliseconds coalesce)
    : path_(path),
      reader_(io),
      on_line_(std::move(on_line)),
      buffer_(64 * 1024),
      coalesce_(coalesce),
      rest_(io) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    fail(errno, "cannot replace the timer FIFO " + path);
  }
  if (::mkfifo(path.c_str(), 0600) != 0) fail(errno, "cannot create the timer FIFO " + path);
  name_ = OwnedPath(path);
  sys::UniqueFd reader(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!reader) fail(errno, "cannot open the timer FIFO " + path);
  // Succeeds without blocking now that a reader exists.
  writer_.reset(::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  if (!writer_) fail(errno, "cannot open the timer FIFO " + path + " for writing");
  reader_.assign(reader.release());
  read();
}

TimerFifo::~TimerFifo() {
  boost::system::error_code ignored;
  reader_.close(ignored);
  rest_.cancel();
}

void TimerFifo::read_queued() {
  const int fd = resting_ ? resting_.get() : reader_.is_open() ? reader_.native_handle() : -1;
  if (fd < 0) return;
  for (;;) {
    const ssize_t n = ::read(fd, buffer_.data(), buffer_.size());
    if (n > 0) {
      feed(std::string_view(buffer_.data(), static_cast<size_t>(n)));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return;  // EAGAIN: empty (end-of-file cannot happen while writer_ is open)
    }
  }
}

void TimerFifo::read() {
  reader_.async_read_some(asio::buffer(buffer_), [this, alive = std::weak_ptr<char>(alive_)](
                                                     boost::system::error_code ec, size_t n) {
    if (alive.expired() || ec == asio::error::operation_aborted) return;
    if (ec) {  // not even end-of-file can happen while writer_ is open
      sys::log_line("hang watchdog: timer FIFO " + path_ + " stopped: " + ec.message());
      return;
    }
    feed(std::string_view(buffer_.data(), n));
    if (coalesce_.count() <= 0) {
      read();
      return;
    }
    resting_.reset(reader_.release());
    rest_.expires_after(coalesce_);
    rest_.async_wait([this, alive](boost::system::error_code ec) {
      if (alive.expired() || ec) return;
      boost::system::error_code assign_error;
      reader_.assign(resting_.get(), assign_error);
      if (assign_error) {
        sys::log_line("hang watchdog: timer FIFO " + path_ + " stopped: " + assign_error.message());
        return;
      }
      resting_.release();
      read();
    });
  });
}

void TimerFifo::feed(std::string_view data) {
  while (!data.empty()) {
    const size_t newline = data.find('\n');
    const std::string_view piece = data.substr(0, newline);
    if (!skipping_) {
      if (partial_.size() + piece.size() > kMaxLine) {
        skipping_ = true;
        partial_.clear();
        on_line_({}, true);
      } else if (newline != std::string_view::npos && partial_.empty()) {
        on_line_(piece, false);  // the usual case: a whole line in one read, no copy
      } else {
        partial_.append(piece);
        if (newline != std::string_view::npos) {
          on_line_(partial_, false);
          partial_.clear();
        }
      }
    }
    if (newline == std::string_view::npos) return;
    skipping_ = false;
    data.remove_prefix(newline + 1);
  }
}

}  // namespace ddprun::agent
