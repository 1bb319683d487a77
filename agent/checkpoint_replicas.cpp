#include "agent/checkpoint_replicas.hpp"

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "agent/memory_checkpoints.hpp"
#include "agent/replica_io.hpp"
#include "store/sys/async_resolve.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using asio::ip::tcp;
using json = nlohmann::json;
using namespace std::chrono_literals;
using namespace replica_io;

constexpr size_t kRequestBuffer = 1 << 20;  // a request line and the start of a file
constexpr auto kTransferTimeout = 600s;     // a whole file, either way
constexpr auto kRetry = 1s;                 // after a failed push

}  // namespace

CheckpointReplicas::CheckpointReplicas(asio::io_context& io, std::string dir, uint64_t limit,
                                       std::string job_id)
    : io_(io),
      dir_(std::move(dir)),
      limit_(limit),
      job_(std::move(job_id)),
      acceptor_(io),
      wake_(io) {
  tcp::endpoint any(tcp::v6(), 0);
  boost::system::error_code ec;
  acceptor_.open(tcp::v6(), ec);
  if (!ec) acceptor_.set_option(asio::ip::v6_only(false), ec);
  if (ec) {  // no IPv6 here: IPv4 alone
    acceptor_.close(ec);
    any = tcp::endpoint(tcp::v4(), 0);
    acceptor_.open(tcp::v4());
  }
  acceptor_.bind(any);
  acceptor_.listen();
  port_ = acceptor_.local_endpoint().port();

  inotify_ = sys::UniqueFd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!inotify_ ||
      ::inotify_add_watch(inotify_.get(), dir_.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
    throw std::runtime_error("cannot watch " + dir_ + ": " + std::strerror(errno));
  }
  watch_ = std::make_unique<asio::posix::stream_descriptor>(io_, ::dup(inotify_.get()));
  wake_.expires_at(std::chrono::steady_clock::time_point::max());

  std::weak_ptr<char> alive = alive_;
  auto guarded = [alive](std::exception_ptr e) {
    if (e && !alive.expired()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        sys::log_line(std::string("warning: checkpoint replicas: ") + ex.what());
      }
    }
  };
  asio::co_spawn(io_, accept_loop(), guarded);
  asio::co_spawn(io_, watch_loop(), guarded);
  asio::co_spawn(io_, push_loop(), guarded);
}

CheckpointReplicas::~CheckpointReplicas() {
  alive_.reset();
  boost::system::error_code ec;
  acceptor_.close(ec);
  if (watch_) watch_->close(ec);
  wake_.cancel();
}

std::string CheckpointReplicas::files_of(int rank) const {
  if (rank >= 0 && rank == rank_) return dir_;
  std::string replica = dir_ + "/.replicas/" + std::to_string(rank);
  std::error_code ec;
  return rank >= 0 && fs::is_directory(replica, ec) ? replica : std::string();
}

void CheckpointReplicas::wake_pusher() {
  wake_.cancel();
}

asio::awaitable<void> CheckpointReplicas::accept_loop() {
  std::weak_ptr<char> alive = alive_;
  for (;;) {
    tcp::socket socket = co_await acceptor_.async_accept(asio::use_awaitable);
    if (alive.expired()) co_return;
    asio::co_spawn(io_, serve(std::move(socket)), asio::detached);
  }
}

asio::awaitable<void> CheckpointReplicas::serve(tcp::socket socket) {
  std::weak_ptr<char> alive = alive_;
  try {
    Deadline deadline(io_, socket, kTransferTimeout);
    asio::streambuf buf(kMaxLine + kRequestBuffer);
    std::string line;
    {
      Deadline first(io_, socket, kRequestTimeout);
      line = co_await read_line(socket, buf);
    }
    if (alive.expired()) co_return;
    json req = json::parse(line);
    if (req.value("job", std::string()) != job_) co_return;  // another job's agent
    const int rank = req.at("rank").get<int>();
    const std::string op = req.at("op").get<std::string>();
    if (op == "put") {
      co_await serve_put(socket, buf, rank, req.at("name").get<std::string>(),
                         req.at("size").get<uint64_t>(), req.value("round", -1));
    } else if (op == "get") {
      co_await serve_get(socket, rank);
    }
  } catch (const std::exception&) {
    // A malformed or broken request: that connection closes, nothing else happens.
  }
}

asio::awaitable<void> CheckpointReplicas::serve_put(tcp::socket& socket, asio::streambuf& buf,
                                                    int rank, const std::string& name,
                                                    uint64_t size, int round) {
  std::string reply = "OK\n";
  std::string dir = dir_ + "/.replicas/" + std::to_string(rank);
  if (!is_checkpoint_name(name) || name.find('/') != std::string::npos || rank < 0) {
    co_return;
  }
  if (bytes_under(dir_ + "/.replicas") + size > limit_) {
    reply = "NO it would pass this node's bound for replicas\n";
    co_await asio::async_write(socket, asio::buffer(reply), asio::use_awaitable);
    co_return;
  }
  std::error_code ec;
  // Replicas two rounds older than this push are of no use to any restore now.
  for (const auto& e : fs::directory_iterator(dir_ + "/.replicas", ec)) {
    if (e.path() != fs::path(dir) && stamp_of(e.path().string()) < round - 1) {
      fs::remove_all(e.path(), ec);
    }
  }
  fs::create_directories(dir, ec);
  co_await receive_file(socket, buf, size, dir + "/" + name);
  if (stamp_of(dir) != round) set_stamp(dir, round);
  co_await asio::async_write(socket, asio::buffer(reply), asio::use_awaitable);
}

asio::awaitable<void> CheckpointReplicas::serve_get(tcp::socket& socket, int rank) {
  std::string from = files_of(rank);
  const int stamp = from.empty() ? -1 : from == dir_ ? round_ : stamp_of(from);
  std::string round_line = json{{"round", stamp}}.dump() + "\n";
  co_await asio::async_write(socket, asio::buffer(round_line), asio::use_awaitable);
  std::error_code ec;
  if (!from.empty()) {
    for (const auto& e : fs::directory_iterator(from, ec)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file() || !is_checkpoint_name(name)) continue;
      sys::UniqueFd fd = co_await open_saved(io_, e.path().string());
      struct stat st {};
      if (!fd || ::fstat(fd.get(), &st) != 0) continue;
      std::string head = json{{"name", name}, {"size", st.st_size}}.dump() + "\n";
      co_await asio::async_write(socket, asio::buffer(head), asio::use_awaitable);
      co_await send_file(socket, fd.get(), static_cast<uint64_t>(st.st_size));
    }
  }
  co_await asio::async_write(socket, asio::buffer(std::string("END\n")), asio::use_awaitable);
}

asio::awaitable<void> CheckpointReplicas::watch_loop() {
  std::weak_ptr<char> alive = alive_;
  alignas(inotify_event) char buf[16 * 1024];
  for (;;) {
    co_await watch_->async_wait(asio::posix::stream_descriptor::wait_read, asio::use_awaitable);
    if (alive.expired()) co_return;
    for (;;) {
      ssize_t n = ::read(inotify_.get(), buf, sizeof buf);
      if (n <= 0) break;
      for (char* p = buf; p < buf + n;) {
        auto* ev = reinterpret_cast<inotify_event*>(p);
        p += sizeof(inotify_event) + ev->len;
        std::string name = ev->len ? std::string(ev->name) : std::string();
        if (!(ev->mask & IN_ISDIR) && is_checkpoint_name(name)) dirty_.insert(name);
      }
    }
    if (!dirty_.empty()) wake_pusher();
  }
}

asio::awaitable<void> CheckpointReplicas::push_loop() {
  std::weak_ptr<char> alive = alive_;
  for (;;) {
    if (dirty_.empty() || successor_.port == 0 || rank_ < 0) {
      boost::system::error_code ec;
      wake_.expires_at(std::chrono::steady_clock::time_point::max());
      co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (alive.expired()) co_return;
      continue;
    }
    std::string name = *dirty_.begin();
    dirty_.erase(dirty_.begin());
    std::string error = co_await push(name);
    if (alive.expired()) co_return;
    if (error.empty()) {
      if (!push_error_.empty()) {
        sys::log_line("checkpoint replicas: pushing to node " + std::to_string(successor_rank_) +
                      " works again");
      }
      push_error_.clear();
      continue;
    }
    if (error != push_error_) {
      sys::log_line("warning: checkpoint replicas: cannot push '" + name + "' to node " +
                    std::to_string(successor_rank_) + " (" + successor_.host + "): " + error +
                    "; retrying");
      push_error_ = error;
    }
    dirty_.insert(name);
    asio::steady_timer pause(io_, kRetry);
    boost::system::error_code ec;
    co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (alive.expired()) co_return;
  }
}

asio::awaitable<std::string> CheckpointReplicas::push(const std::string& name) {
  const std::string path = dir_ + "/" + name;
  const ReplicaPeer to = successor_;
  const int rank = rank_;
  const int round = round_;
  tcp::socket socket(io_);
  try {
    sys::UniqueFd fd = co_await open_saved(io_, path);
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0) co_return std::string();  // gone since: nothing to do
    co_await connect(io_, socket, to);
    Deadline deadline(io_, socket, kTransferTimeout);
    std::string head = json{{"op", "put"},    {"job", job_},  {"rank", rank},
                            {"round", round}, {"name", name}, {"size", st.st_size}}
                           .dump() +
                       "\n";
    co_await asio::async_write(socket, asio::buffer(head), asio::use_awaitable);
    co_await send_file(socket, fd.get(), static_cast<uint64_t>(st.st_size));
    asio::streambuf buf(kMaxLine);
    std::string reply = co_await read_line(socket, buf);
    if (reply != "OK") co_return reply.empty() ? std::string("no answer") : reply;
  } catch (const boost::system::system_error& e) {
    co_return e.code().message();  // what() also names Boost's source file
  } catch (const std::exception& e) {
    co_return std::string(e.what());
  }
  co_return std::string();
}

asio::awaitable<CheckpointReplicas::Fetched> CheckpointReplicas::fetch(const ReplicaPeer& peer,
                                                                       int rank,
                                                                       const std::string& into) {
  Fetched got;
  tcp::socket socket(io_);
  std::error_code ec;
  fs::remove_all(into, ec);
  fs::create_directories(into, ec);
  try {
    co_await connect(io_, socket, peer);
    Deadline deadline(io_, socket, kTransferTimeout);
    std::string head = json{{"op", "get"}, {"job", job_}, {"rank", rank}}.dump() + "\n";
    co_await asio::async_write(socket, asio::buffer(head), asio::use_awaitable);
    asio::streambuf buf(kMaxLine + kRequestBuffer);
    got.round = json::parse(co_await read_line(socket, buf)).at("round").get<int>();
    for (;;) {
      std::string line = co_await read_line(socket, buf);
      if (line == "END") break;
      json f = json::parse(line);
      const std::string name = f.at("name").get<std::string>();
      if (!is_checkpoint_name(name) || name.find('/') != std::string::npos) {
        throw std::runtime_error("bad name");
      }
      const uint64_t size = f.at("size").get<uint64_t>();
      co_await receive_file(socket, buf, size, into + "/" + name);
      ++got.files;
      got.bytes += size;
    }
  } catch (const std::exception&) {
    fs::remove_all(into, ec);
    co_return Fetched{};
  }
  co_return got;
}

asio::awaitable<void> CheckpointReplicas::round_formed(int rank, int round,
                                                       std::vector<ReplicaPeer> peers) {
  const int n = static_cast<int>(peers.size());
  const ReplicaPeer successor = n > 1 ? peers[static_cast<size_t>((rank + 1) % n)] : ReplicaPeer{};
  const bool new_successor = successor.host != successor_.host || successor.port != successor_.port;
  successor_ = successor;
  successor_rank_ = n > 1 ? (rank + 1) % n : -1;
  push_error_.clear();
  const int previous_round = round_;
  round_ = round;
  std::error_code ec;
  auto push_all = [&] {  // a successor new to this node's state gets all of it
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (e.is_regular_file() && is_checkpoint_name(name)) dirty_.insert(name);
    }
  };
  if (rank == rank_) {
    if (new_successor) push_all();
    if (!dirty_.empty()) wake_pusher();
    co_return;
  }
  const auto started = std::chrono::steady_clock::now();
  // What the directory holds becomes the replica of the rank it was saved as (stamped with the
  // round it was saved in): the node that has that rank now may ask for it.
  if (rank_ >= 0) {
    const std::string as_replica = dir_ + "/.replicas/" + std::to_string(rank_);
    fs::remove_all(as_replica, ec);
    move_checkpoints(dir_, as_replica);
    set_stamp(as_replica, previous_round);
  }
  rank_ = -1;
  dirty_.clear();
  remove_checkpoints(dir_);

  // The newest copy of `rank`'s state: this node's replica, else the peers' (its successor's
  // first); a copy of the last round is the newest there is.
  Fetched best;
  std::string best_dir, from;
  const std::string mine = dir_ + "/.replicas/" + std::to_string(rank);
  if (round > 0 && fs::is_directory(mine, ec)) {
    best = Fetched{stamp_of(mine), 0, 0};
    best_dir = mine;
    from = "this node's replica";
  }
  for (int i = 1; round > 0 && best.round < round - 1 && i < n; ++i) {
    const ReplicaPeer& peer = peers[static_cast<size_t>((rank + i) % n)];
    if (peer.port == 0) continue;
    const std::string into = dir_ + "/.incoming-" + std::to_string(i);
    Fetched got = co_await fetch(peer, rank, into);
    if (got.files > 0 && got.round > best.round) {
      if (best_dir.starts_with(dir_ + "/.incoming-")) fs::remove_all(best_dir, ec);
      best = got;
      best_dir = into;
      from = "node " + std::to_string((rank + i) % n) + " (" + peer.host + ")";
    } else {
      fs::remove_all(into, ec);
    }
  }
  const size_t files = best_dir.empty() ? 0 : move_checkpoints(best_dir, dir_);
  if (best_dir.starts_with(dir_ + "/.incoming-")) fs::remove_all(best_dir, ec);
  rank_ = rank;
  if (files) {
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.2f", took);
    sys::log_line("memory checkpoints: node rank " + std::to_string(rank) + "'s state (" +
                  std::to_string(files) + " file(s), saved in round " + std::to_string(best.round) +
                  ") restored from " + from + " in " + seconds + " s");
    push_all();
  } else if (round > 0) {
    sys::log_line("memory checkpoints: no node holds node rank " + std::to_string(rank) +
                  "'s state; its workers start without one");
  }
  if (!dirty_.empty()) wake_pusher();
}

}  // namespace ddprun::agent
