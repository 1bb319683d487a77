#include "store/raw_client_test_util.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>

#include "store/wire.hpp"

namespace ddprun::store::test {

RawConn::RawConn(uint16_t port, const std::string& host, const std::string& source) {
  bool v6 = host.find(':') != std::string::npos;
  fd_.reset(::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int one = 1;
  ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (!source.empty()) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ::inet_pton(AF_INET, source.c_str(), &from.sin_addr);
    EXPECT_EQ(::bind(fd_.get(), reinterpret_cast<sockaddr*>(&from), sizeof from), 0)
        << "bind " << source << ": " << std::strerror(errno);
  }
  int rc;
  if (v6) {
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_port = htons(port);
    ::inet_pton(AF_INET6, host.c_str(), &addr.sin6_addr);
    rc = ::connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
    rc = ::connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  }
  EXPECT_EQ(rc, 0) << "connect to " << host << ":" << port << ": " << std::strerror(errno);
}

void RawConn::send(std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ADD_FAILURE() << "send: " << std::strerror(errno);
      return;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

std::string RawConn::recv(size_t n, std::chrono::milliseconds timeout) {
  std::string out(n, '\0');
  size_t got = 0;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (got < n) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd_.get(), POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      ADD_FAILURE() << "timed out after " << got << " of " << n << " bytes";
      break;
    }
    ssize_t r = ::recv(fd_.get(), out.data() + got, n - got, 0);
    if (r <= 0) {
      ADD_FAILURE() << "connection closed after " << got << " of " << n << " bytes";
      break;
    }
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

bool RawConn::closed_by_peer(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd_.get(), POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    ssize_t r = ::recv(fd_.get(), buf, sizeof buf, 0);
    if (r <= 0) return true;
  }
}

std::string i64_bytes(int64_t v) {
  std::string s;
  wire::put_i64(s, v);
  return s;
}

std::string str_bytes(std::string_view v) {
  std::string s;
  wire::put_bytes(s, v);
  return s;
}

uint16_t RawConn::local_port() const {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

}  // namespace ddprun::store::test
