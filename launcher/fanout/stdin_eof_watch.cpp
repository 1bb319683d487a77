#include "launcher/fanout/stdin_eof_watch.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include "store/sys/log.hpp"

namespace ddprun::launcher {
namespace {

// A private, non-blocking, close-on-exec copy of stdin; fd 0 becomes /dev/null.
int take_stdin() {
  int fd = ::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) return -1;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd >= 0) {
    ::dup2(null_fd, STDIN_FILENO);
    ::close(null_fd);
  }
  return fd;
}

}  // namespace

StdinEofWatch::StdinEofWatch(boost::asio::io_context& io) : in_(io, take_stdin()), buffer_(4096) {
  arm();
}

void StdinEofWatch::arm() {
  in_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                 [this](boost::system::error_code ec) {
                   if (ec == boost::asio::error::operation_aborted) return;
                   if (!ec && drain()) {
                     arm();
                     return;
                   }
                   if (fired_) return;
                   fired_ = true;
                   sys::log_line(
                       "stdin closed (the launching ddprun or its ssh connection is "
                       "gone): stopping the job as on SIGTERM");
                   ::kill(::getpid(), SIGTERM);
                 });
}

bool StdinEofWatch::drain() {
  for (;;) {
    ssize_t n = ::read(in_.native_handle(), buffer_.data(), buffer_.size());
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

}  // namespace ddprun::launcher
