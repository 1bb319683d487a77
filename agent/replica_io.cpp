#include "agent/replica_io.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "store/sys/async_resolve.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent::replica_io {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using asio::ip::tcp;

namespace {
constexpr size_t kChunk = 1 << 20;
}  // namespace

// A saved checkpoint (not a temp file of a save in progress, not the replicas).
bool is_checkpoint_name(const std::string& name) {
  return !name.empty() && name[0] != '.' && name.find(".tmp") == std::string::npos;
}

Deadline::Deadline(asio::io_context& io, tcp::socket& socket,
                   std::chrono::steady_clock::duration after)
    : timer_(io), armed_(std::make_shared<bool>(true)) {
  timer_.expires_after(after);
  timer_.async_wait([&socket, armed = armed_](boost::system::error_code ec) {
    if (!ec && *armed) socket.close(ec);
  });
}

Deadline::~Deadline() {
  *armed_ = false;
  timer_.cancel();
}

// Connects to a peer (its address resolved off the agent's thread), within kRequestTimeout.
asio::awaitable<void> connect(asio::io_context& io, tcp::socket& socket, const ReplicaPeer& peer) {
  std::string error;
  auto addrs = co_await sys::async_resolve(peer.host, static_cast<uint16_t>(peer.port), &error);
  if (addrs.empty()) throw std::runtime_error("cannot resolve " + peer.host + ": " + error);
  tcp::endpoint ep;
  ep.resize(addrs.front().len);
  std::memcpy(ep.data(), &addrs.front().addr, addrs.front().len);
  Deadline connecting(io, socket, kRequestTimeout);
  co_await socket.async_connect(ep, asio::use_awaitable);
}

// The round a replica directory's files were pushed in (-1: unknown).
int stamp_of(const std::string& dir) {
  std::ifstream in(dir + "/.round");
  int round = -1;
  return in >> round ? round : -1;
}

void set_stamp(const std::string& dir, int round) {
  std::ofstream(dir + "/.round", std::ios::trunc) << round << "\n";
}

// Reads one line (without its '\n') of at most kMaxLine bytes; throws on EOF or a longer one.
asio::awaitable<std::string> read_line(tcp::socket& s, asio::streambuf& buf) {
  size_t n = co_await asio::async_read_until(s, buf, '\n', asio::use_awaitable);
  std::string line(asio::buffers_begin(buf.data()), asio::buffers_begin(buf.data()) + n - 1);
  buf.consume(n);
  co_return line;
}

asio::awaitable<sys::UniqueFd> open_saved(asio::io_context& io, const std::string& path) {
  constexpr auto kPause = std::chrono::milliseconds(1);
  constexpr int kTries = 5000;
  for (int i = 0; i < kTries; ++i) {
    sys::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd || ::flock(fd.get(), LOCK_SH | LOCK_NB) == 0) co_return fd;
    fd.reset();  // a save holds it: open the name again, which may be a newer file by then
    asio::steady_timer pause(io, kPause);
    co_await pause.async_wait(asio::use_awaitable);
  }
  throw std::runtime_error(path + ": a save has held it for over 5 s");
}

// Writes `size` bytes of `fd` to the socket.
asio::awaitable<void> send_file(tcp::socket& s, int fd, uint64_t size) {
  std::vector<char> chunk(std::min<uint64_t>(kChunk, std::max<uint64_t>(size, 1)));
  uint64_t sent = 0;
  while (sent < size) {
    ssize_t got = ::pread(fd, chunk.data(), std::min<uint64_t>(chunk.size(), size - sent),
                          static_cast<off_t>(sent));
    if (got <= 0) throw std::runtime_error("the file shrank while it was sent");
    co_await asio::async_write(s, asio::buffer(chunk.data(), static_cast<size_t>(got)),
                               asio::use_awaitable);
    sent += static_cast<uint64_t>(got);
  }
}

// Receives `size` bytes (some may already be in `buf`) into `path`, atomically: a temp file
// beside it, renamed over it once complete.
asio::awaitable<void> receive_file(tcp::socket& s, asio::streambuf& buf, uint64_t size,
                                   const std::string& path) {
  fs::path target(path);
  std::string temp = (target.parent_path() / ("." + target.filename().string() + ".tmp")).string();
  sys::UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) throw std::runtime_error(temp + ": " + std::strerror(errno));
  uint64_t got = 0;
  auto put = [&](const char* data, size_t n) {
    if (::write(fd.get(), data, n) != static_cast<ssize_t>(n)) {
      throw std::runtime_error(temp + ": " + std::strerror(errno));
    }
    got += n;
  };
  size_t buffered = std::min<uint64_t>(buf.size(), size);
  if (buffered) {
    std::string head(asio::buffers_begin(buf.data()), asio::buffers_begin(buf.data()) + buffered);
    put(head.data(), head.size());
    buf.consume(buffered);
  }
  std::vector<char> chunk(kChunk);
  try {
    while (got < size) {
      size_t n = co_await s.async_read_some(
          asio::buffer(chunk.data(), std::min<uint64_t>(chunk.size(), size - got)),
          asio::use_awaitable);
      put(chunk.data(), n);
    }
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  fd.reset();
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    ::unlink(temp.c_str());
    throw std::runtime_error(path + ": " + std::strerror(errno));
  }
}

// Moves every checkpoint file of `from` into `to` (replacing files of the same names).
size_t move_checkpoints(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::create_directories(to, ec);
  size_t moved = 0;
  for (const auto& e : fs::directory_iterator(from, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || !is_checkpoint_name(name)) continue;
    if (::rename(e.path().c_str(), (fs::path(to) / name).c_str()) == 0) ++moved;
  }
  return moved;
}

void remove_checkpoints(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && is_checkpoint_name(e.path().filename().string())) {
      fs::remove(e.path(), ec);
    }
  }
}

}  // namespace ddprun::agent::replica_io
