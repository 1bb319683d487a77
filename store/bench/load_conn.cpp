#include "store/bench/load_conn.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "store/sys/fd.hpp"
#include "store/wire.hpp"

namespace ddprun::store::bench {
namespace {

int ms_until(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return ms.count() < 0 ? 0 : static_cast<int>(std::min<int64_t>(ms.count(), 1 << 30));
}

sys::UniqueFd start_connect(const sockaddr_in& addr) {
  sys::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  if (rc != 0 && errno != EINPROGRESS) fd.reset();
  return fd;
}

}  // namespace

uint8_t Frames::opcode(Op op) const {
  return dialect == Dialect::kTorch1 ? torch1_opcode(op) : torch2_opcode(op);
}

std::string Frames::set(std::string_view key, std::string_view value) const {
  std::string f(1, static_cast<char>(opcode(Op::kSet)));
  wire::put_bytes(f, key);
  wire::put_bytes(f, value);
  return f;
}

std::string Frames::get(std::string_view key) const {
  std::string f(1, static_cast<char>(opcode(Op::kGet)));
  wire::put_bytes(f, key);
  return f;
}

std::string Frames::add(std::string_view key, int64_t delta) const {
  std::string f(1, static_cast<char>(opcode(Op::kAdd)));
  wire::put_bytes(f, key);
  wire::put_i64(f, delta);
  return f;
}

std::string Frames::wait(std::string_view key) const {
  std::string f(1, static_cast<char>(opcode(Op::kWait)));
  wire::put_u64(f, 1);
  wire::put_bytes(f, key);
  return f;
}

std::string Frames::wait(const std::vector<std::string>& keys) const {
  std::string f(1, static_cast<char>(opcode(Op::kWait)));
  wire::put_u64(f, keys.size());
  for (const std::string& k : keys) wire::put_bytes(f, k);
  return f;
}

std::string Frames::num_keys() const {
  return std::string(1, static_cast<char>(opcode(Op::kGetNumKeys)));
}

bool send_all(Conn& c, const std::string& bytes, Clock::time_point deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(c.fd.get(), bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{c.fd.get(), POLLOUT, 0};
      if (::poll(&p, 1, ms_until(deadline)) <= 0) return false;
    } else {
      return false;
    }
  }
  return true;
}

bool recv_exact(Conn& c, size_t n, Clock::time_point deadline) {
  c.in.assign(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(c.fd.get(), c.in.data() + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{c.fd.get(), POLLIN, 0};
      if (::poll(&p, 1, ms_until(deadline)) <= 0) return false;
    } else {
      return false;
    }
  }
  return true;
}

std::vector<Conn> connect_all(const std::string& host, uint16_t port, size_t n, Dialect dialect,
                              Clock::time_point deadline) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  std::vector<Conn> conns(n);
  constexpr size_t kBatch = 256;
  for (size_t base = 0; base < n; base += kBatch) {
    size_t end = std::min(n, base + kBatch);
    for (size_t i = base; i < end; ++i) {
      conns[i].fd = start_connect(addr);
      conns[i].failed = !conns[i].fd;
    }
    for (size_t i = base; i < end; ++i) {  // wait for each connect to complete
      if (conns[i].failed) continue;
      pollfd p{conns[i].fd.get(), POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      if (::poll(&p, 1, ms_until(deadline)) <= 0 ||
          ::getsockopt(conns[i].fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        conns[i].failed = true;
      }
    }
    if (dialect != Dialect::kTorch2) continue;
    std::string hello("\x00\xCE\xF7\x85\x3C\x0D\x2A\x00\x00\x00", 10);  // VALIDATE + PING 42
    for (size_t i = base; i < end; ++i) {
      if (!conns[i].failed && !send_all(conns[i], hello, deadline)) conns[i].failed = true;
    }
    for (size_t i = base; i < end; ++i) {
      if (!conns[i].failed && (!recv_exact(conns[i], 4, deadline) ||
                               conns[i].in != std::string("\x2A\x00\x00\x00", 4))) {
        conns[i].failed = true;
      }
    }
  }
  return conns;
}

Clock::time_point Driver::run(std::vector<Conn>& conns, Clock::time_point stop,
                              Clock::time_point hard_deadline, bool send_first) {
  sys::UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  size_t active = 0;
  for (size_t i = 0; i < conns.size(); ++i) {
    Conn& c = conns[i];
    if (c.failed) continue;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = i;
    ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, c.fd.get(), &ev);
    c.in.clear();
    if (send_first && !send_all(c, next(i, c), hard_deadline)) {
      c.failed = true;
      continue;
    }
    ++active;
  }
  Clock::time_point last = Clock::now();
  std::vector<epoll_event> events(256);
  char buf[64 << 10];
  while (active > 0 && Clock::now() < hard_deadline) {
    int n = ::epoll_wait(ep.get(), events.data(), static_cast<int>(events.size()),
                         std::min(ms_until(hard_deadline), 100));
    for (int e = 0; e < n; ++e) {
      size_t i = events[e].data.u64;
      Conn& c = conns[i];
      if (c.failed) continue;
      ssize_t r = ::recv(c.fd.get(), buf, std::min(sizeof buf, c.want - c.in.size()), 0);
      if (r <= 0) {
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        c.failed = true;
        --active;
        ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
        continue;
      }
      c.in.append(buf, static_cast<size_t>(r));
      if (c.in.size() < c.want) continue;
      last = Clock::now();
      if (!check(i, c)) c.failed = true;
      ++c.done;
      c.in.clear();
      if (c.failed || last >= stop || !send_all(c, next(i, c), hard_deadline)) {
        --active;
        ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
      }
    }
  }
  return last;
}

}  // namespace ddprun::store::bench
