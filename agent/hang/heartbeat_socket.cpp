#include "agent/hang/heartbeat_socket.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "store/sys/fd.hpp"
#include "store/sys/log.hpp"

namespace ddprun::agent {

namespace {

namespace asio = boost::asio;

// Big enough that a burst from every worker fits while the agent is busy; the kernel caps it
// at net.core.rmem_max (and doubles it).
constexpr int kReceiveBuffer = 4 << 20;
// SCM_RIGHTS a sender might push on us: received, then closed at once.
constexpr size_t kMaxFds = 16;

[[noreturn]] void fail(int error, const std::string& what) {
  throw std::system_error(error, std::generic_category(), what);
}

sockaddr_un socket_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    fail(ENAMETOOLONG, "heartbeat socket " + path + " (a Unix socket path has at most " +
                           std::to_string(sizeof(addr.sun_path) - 1) + " bytes)");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// A socket file nobody receives on (its agent died) refuses connections: remove it so bind can
// reuse the name. A live socket, or anything else, is left for bind to refuse.
void remove_stale_socket(const sockaddr_un& addr) {
  struct stat st {};
  if (::lstat(addr.sun_path, &st) != 0 || !S_ISSOCK(st.st_mode)) return;
  sys::UniqueFd probe(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!probe) return;
  if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 &&
      errno == ECONNREFUSED) {
    ::unlink(addr.sun_path);
  }
}

void set_option(int fd, int name, int value, const std::string& path) {
  if (::setsockopt(fd, SOL_SOCKET, name, &value, sizeof value) != 0) {
    fail(errno, "heartbeat socket " + path + ": setsockopt");
  }
}

}  // namespace

HeartbeatSocket::HeartbeatSocket(asio::io_context& io, const std::string& path,
                                 BeatCallback on_beat, std::chrono::milliseconds coalesce)
    : path_(path), socket_(io), on_beat_(std::move(on_beat)), coalesce_(coalesce), rest_(io) {
  const sockaddr_un addr = socket_address(path);
  sys::UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) fail(errno, "heartbeat socket " + path + ": socket");
  // Before bind: the kernel attaches credentials to a datagram when it is sent, and only if
  // the receiver asked for them by then.
  set_option(fd.get(), SO_PASSCRED, 1, path);
  set_option(fd.get(), SO_RCVBUF, kReceiveBuffer, path);
  remove_stale_socket(addr);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    fail(errno, "cannot bind the heartbeat socket " + path);
  }
  name_ = OwnedPath(path);
  // Workers run as the agent's user; nobody else has anything to say here.
  if (::chmod(path.c_str(), 0600) != 0) fail(errno, "heartbeat socket " + path + ": chmod");
  socket_.assign(asio::local::datagram_protocol(), fd.release());
  wait();
}

HeartbeatSocket::~HeartbeatSocket() {
  boost::system::error_code ignored;
  socket_.close(ignored);
  rest_.cancel();
}

void HeartbeatSocket::wait() {
  socket_.async_wait(asio::socket_base::wait_read, [this, alive = std::weak_ptr<char>(alive_)](
                                                       boost::system::error_code ec) {
    if (alive.expired() || ec == asio::error::operation_aborted) return;
    if (ec) {
      sys::log_line("hang watchdog: heartbeat socket " + path_ + " stopped: " + ec.message());
      return;
    }
    drain();
  });
}

namespace {

// What one datagram is received into: the payload (ignored, truncated) and its ancillary data.
struct Slot {
  char payload[64];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(kMaxFds * sizeof(int))];
};

// The sender's pid (0 if the kernel attached none). Descriptors a sender pushed on us with
// SCM_RIGHTS are ours once received: closed here.
pid_t take_sender(msghdr& msg) {
  pid_t sender = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET) continue;
    if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
      ucred cred{};
      std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
      sender = cred.pid;
    } else if (c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t k = 0; k < count; ++k) {
        int passed = -1;
        std::memcpy(&passed, CMSG_DATA(c) + k * sizeof(int), sizeof(int));
        sys::UniqueFd discard(passed);
      }
    }
  }
  return sender;
}

}  // namespace

// Reads up to `limit` datagrams, kBatch per recvmmsg: one system call per wake-up in the usual
// case. Returns how many were read, or -1 when the socket broke (logged).
int HeartbeatSocket::receive(int limit) {
  constexpr unsigned kBatch = 32;
  Slot slots[kBatch];
  iovec iovs[kBatch];
  mmsghdr msgs[kBatch];
  const int fd = this->fd();
  const auto now = Clock::now();
  int received = 0;
  while (received < limit) {
    for (unsigned i = 0; i < kBatch; ++i) {
      iovs[i] = {slots[i].payload, sizeof slots[i].payload};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_iov = &iovs[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      msgs[i].msg_hdr.msg_control = slots[i].control;
      msgs[i].msg_hdr.msg_controllen = sizeof slots[i].control;
    }
    const int n = ::recvmmsg(fd, msgs, kBatch, MSG_DONTWAIT | MSG_CMSG_CLOEXEC, nullptr);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      sys::log_line("hang watchdog: heartbeat socket " + path_ +
                    " stopped: recvmmsg: " + std::strerror(errno));
      return -1;
    }
    received += n;
    for (int i = 0; i < n; ++i) {
      const pid_t sender = take_sender(msgs[i].msg_hdr);
      if (sender > 0) on_beat_(sender, now);
    }
    if (static_cast<unsigned>(n) < kBatch) break;  // the queue was empty
  }
  return received;
}

void HeartbeatSocket::read_queued() {
  if (socket_.is_open() || resting_) receive(kMaxPerWakeup);
}

// Reads until the queue is empty. The socket is edge-triggered in Asio's reactor, so it must be
// left empty before waiting again; past kMaxPerWakeup the rest is read in a posted
// continuation, after the io_context's other work. After beats, it rests for coalesce_ and then
// drains again (not waits: a queue that filled up while resting makes no new edge).
void HeartbeatSocket::drain() {
  const int n = receive(kMaxPerWakeup);
  if (n < 0) return;
  auto alive = std::weak_ptr<char>(alive_);
  if (n >= kMaxPerWakeup) {
    asio::post(socket_.get_executor(), [this, alive] {
      if (!alive.expired()) drain();
    });
  } else if (n > 0 && coalesce_.count() > 0) {
    resting_.reset(socket_.release());
    rest_.expires_after(coalesce_);
    rest_.async_wait([this, alive](boost::system::error_code ec) {
      if (alive.expired() || ec) return;
      boost::system::error_code assign_error;
      socket_.assign(asio::local::datagram_protocol(), resting_.get(), assign_error);
      if (assign_error) {
        sys::log_line("hang watchdog: heartbeat socket " + path_ +
                      " stopped: " + assign_error.message());
        return;
      }
      resting_.release();
      drain();
    });
  } else {
    wait();
  }
}

}  // namespace ddprun::agent
