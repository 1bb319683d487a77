#include "store/socket_io.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "store/sys/fd.hpp"
#include "store/sys/net.hpp"

namespace ddprun::store::socket_io {
namespace {

// Milliseconds until the deadline for poll(), rounded up; -1 (forever) for time_point::max.
int poll_timeout(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1'000'000'000 ? 1'000'000'000 : static_cast<int>(left);
}

// Polls for `events`; kOk when ready.
Status wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, poll_timeout(deadline));
    if (rc > 0) return Status::kOk;  // errors and hang-ups surface in the next send/recv
    if (rc == 0) return Status::kTimeout;
    if (errno != EINTR) return Status::kError;
  }
}

sys::UniqueFd try_address(const sys::ResolvedAddress& ai, Clock::time_point deadline,
                          std::string* error) {
  sys::UniqueFd fd(::socket(ai.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) {
    *error = std::strerror(errno);
    return {};
  }
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&ai.addr), ai.len) != 0) {
    if (errno != EINPROGRESS) {
      *error = std::strerror(errno);
      return {};
    }
    if (wait_for(fd.get(), POLLOUT, deadline) != Status::kOk) {
      *error = "connect timed out";
      return {};
    }
    int so_error = 0;
    socklen_t len = sizeof so_error;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      *error = std::strerror(so_error);
      return {};
    }
  }
  return fd;
}

}  // namespace

sys::UniqueFd connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline,
                          std::string* error) {
  sys::UniqueFd fd;
  for (const auto& ai : sys::resolve(host, port, false, error)) {
    fd = try_address(ai, deadline, error);
    if (fd) break;
  }
  return fd;
}

Status send_all(int fd, const char* data, size_t size, Clock::time_point deadline) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::send(fd, data + done, size - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      Status s = wait_for(fd, POLLOUT, deadline);
      if (s != Status::kOk) return s;
      continue;
    }
    return (errno == EPIPE || errno == ECONNRESET) ? Status::kClosed : Status::kError;
  }
  return Status::kOk;
}

Status recv_exact(int fd, char* data, size_t size, Clock::time_point deadline) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::recv(fd, data + done, size - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Status::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      Status s = wait_for(fd, POLLIN, deadline);
      if (s != Status::kOk) return s;
      continue;
    }
    return errno == ECONNRESET ? Status::kClosed : Status::kError;
  }
  return Status::kOk;
}

Status wait_readable(int fd, Clock::time_point deadline) {
  return wait_for(fd, POLLIN, deadline);
}

bool set_keep_alive(int fd, std::chrono::milliseconds interval, int probes) {
  const long long ms = std::clamp<long long>(interval.count(), 1, 1LL << 30);
  const int seconds = static_cast<int>(std::clamp<long long>((ms + 999) / 1000, 1, 32767));
  const int count = std::clamp(probes - 1, 1, 127);
  const auto user_timeout =
      static_cast<unsigned>(std::clamp<long long>(ms * std::max(probes, 2), 1000, 1LL << 30));
  const int one = 1;
  return ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) == 0 &&
         ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &seconds, sizeof seconds) == 0 &&
         ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &seconds, sizeof seconds) == 0 &&
         ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count) == 0 &&
         ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout) == 0;
}

}  // namespace ddprun::store::socket_io
