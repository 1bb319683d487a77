#include "agent/process/stream_pump.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "store/sys/console.hpp"
#include "store/sys/fd.hpp"
#include "store/sys/log.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;

StreamPump::StreamPump(asio::io_context& io, sys::UniqueFd pipe_read, PumpSinks sinks)
    : pipe_(io, pipe_read.release()), sinks_(std::move(sinks)) {
  ::fcntl(pipe_.native_handle(), F_SETFL, ::fcntl(pipe_.native_handle(), F_GETFL) | O_NONBLOCK);
}

void StreamPump::start() {
  read_some();
}

// Waits for readability and reads on our side (not async_read_some): a read the reactor had
// already completed but not yet delivered would otherwise race with finish()'s final drain.
void StreamPump::read_some() {
  pipe_.async_wait(asio::posix::stream_descriptor::wait_read,
                   [self = shared_from_this()](boost::system::error_code ec) {
                     if (self->finished_ || ec) return;
                     if (self->drain()) self->read_some();
                   });
}

bool StreamPump::drain() {
  // One read buffer for every pump of the thread (a read is consumed before the next): 2,000
  // tee'd workers' pumps used to hold 256 MB of buffers between them.
  thread_local std::vector<char> buffer(64 * 1024);
  for (;;) {
    ssize_t n = ::read(pipe_.native_handle(), buffer.data(), buffer.size());
    if (n > 0) {
      consume(buffer.data(), static_cast<size_t>(n));
      if (static_cast<size_t>(n) < buffer.size()) return true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && errno == EAGAIN;  // false on EOF or a real error
  }
}

namespace {
std::vector<std::string>& incomplete() {
  static std::vector<std::string> files;
  return files;
}
}  // namespace

const std::vector<std::string>& StreamPump::incomplete_files() {
  return incomplete();
}

void StreamPump::consume(const char* data, size_t size) {
  if (sinks_.file && !sys::write_all(sinks_.file.get(), data, size)) {
    // Said once per file: what follows goes to the console (if tee'd), not to the file.
    const std::string what = sinks_.file_path + " (" + std::strerror(errno) + ")";
    sys::log_line("warning: cannot write the log file " + what + ": it is incomplete from here on" +
                  (sinks_.console_fd >= 0 ? "; its lines still go to the console" : ""));
    incomplete().push_back(what);
    sinks_.file.reset();
  }
  if (sinks_.console_fd >= 0 || sinks_.filtered_file)
    emit_lines(std::string_view(data, size), false);
}

void StreamPump::emit_lines(std::string_view data, bool flush) {
  console_batch_.clear();
  filtered_batch_.clear();
  auto on_line = [this](std::string_view line) {
    if (sinks_.console_fd >= 0) {
      console_batch_ += sinks_.prefix;
      console_batch_ += line;
    }
    if (sinks_.filtered_file) {
      for (const auto& needle : sinks_.filters) {
        if (line.find(needle) != std::string_view::npos) {
          filtered_batch_ += sinks_.prefix;
          filtered_batch_ += line;
          break;
        }
      }
    }
  };
  if (flush) {
    lines_.flush(on_line);
  } else {
    lines_.feed(data, on_line);
  }
  if (!console_batch_.empty()) {
    // Never blocks: a console nobody reads drops lines (counted) rather than stop the agent.
    sys::Console::write(sinks_.console_fd, console_batch_, sys::LineKind::kWorker);
  }
  if (!filtered_batch_.empty()) {
    sys::write_all(sinks_.filtered_file->get(), filtered_batch_.data(), filtered_batch_.size());
  }
}

void StreamPump::finish() {
  if (finished_) return;
  finished_ = true;
  // Whatever the worker wrote before it exited is in the pipe now: read it without blocking.
  drain();
  if (sinks_.console_fd >= 0 || sinks_.filtered_file) emit_lines({}, true);
  boost::system::error_code ec;
  pipe_.close(ec);
  sinks_.file.reset();
}

}  // namespace ddprun::agent
