#include "standby.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace ddprun::detail {

void become_worker_if_standby() {
  const char* fd_text = std::getenv("DDPRUN_STANDBY_FD");
  if (fd_text == nullptr || *fd_text == '\0') return;
  const int fd = std::atoi(fd_text);
  std::vector<char> data(1 << 20);
  iovec iov{data.data(), data.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 2)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) ::_exit(0);  // not needed: the attempt ended, or the agent is gone
  int fds[2] = {-1, -1};
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(sizeof fds)) {
      std::memcpy(fds, CMSG_DATA(c), sizeof fds);
    }
  }
  ::close(fd);
  if (fds[0] < 0 || fds[1] < 0) ::_exit(0);
  ::dup2(fds[0], STDOUT_FILENO);
  ::dup2(fds[1], STDERR_FILENO);
  ::close(fds[0]);
  ::close(fds[1]);
  // The worker's environment replaces the standby's whole (its strings are never freed:
  // putenv keeps them).
  ::clearenv();
  for (size_t at = 0; at < static_cast<size_t>(n);) {
    const char* entry = data.data() + at;
    const size_t len = ::strnlen(entry, static_cast<size_t>(n) - at);
    if (len > 0) ::putenv(::strndup(entry, len));
    at += len + 1;
  }
}

}  // namespace ddprun::detail
