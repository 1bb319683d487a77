// The transfer helpers of the in-memory checkpoint replicas (checkpoint_replicas.hpp): a
// connection's deadline, a peer's connect, request lines, whole files either way (a received
// one lands atomically), and the replica directories' files and round stamps. Private to the
// agent.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "agent/checkpoint_replicas.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent::replica_io {

inline constexpr size_t kMaxLine = 4096;
inline constexpr std::chrono::seconds kRequestTimeout{10};  // a request line; a peer's connect

// A saved checkpoint (not a temp file of a save in progress, not the replicas).
bool is_checkpoint_name(const std::string& name);

// Closes `socket` when `after` passes, unless destroyed first (a handler already queued when
// it is destroyed finds it disarmed).
class Deadline {
 public:
  Deadline(boost::asio::io_context& io, boost::asio::ip::tcp::socket& socket,
           std::chrono::steady_clock::duration after);
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  boost::asio::steady_timer timer_;
  std::shared_ptr<bool> armed_;
};

// Connects to a peer (its address resolved off the agent's thread), within kRequestTimeout.
boost::asio::awaitable<void> connect(boost::asio::io_context& io,
                                     boost::asio::ip::tcp::socket& socket, const ReplicaPeer& peer);
// The round a replica directory's files were pushed in (-1: unknown), and setting it.
int stamp_of(const std::string& dir);
void set_stamp(const std::string& dir, int round);
// Reads one line (without its '\n') of at most kMaxLine bytes; throws on EOF or a longer one.
boost::asio::awaitable<std::string> read_line(boost::asio::ip::tcp::socket& s,
                                              boost::asio::streambuf& buf);
// Opens the saved checkpoint at `path` for reading, with a shared flock held while the fd
// lives. The Python module's saves write over the file of an earlier save (one that a newer
// save has replaced) only when they can flock it exclusively, so a file read under this lock is
// never being written. Waits, 1 ms at a time, while a save holds the file (it has just put it
// in place and not yet let go); invalid where the file is gone. Throws where a save holds it
// for over 5 s (a stopped worker).
boost::asio::awaitable<sys::UniqueFd> open_saved(boost::asio::io_context& io,
                                                 const std::string& path);
// Writes `size` bytes of `fd` to the socket.
boost::asio::awaitable<void> send_file(boost::asio::ip::tcp::socket& s, int fd, uint64_t size);
// Receives `size` bytes (some may already be in `buf`) into `path`, atomically: a temp file
// beside it, renamed over it once complete.
boost::asio::awaitable<void> receive_file(boost::asio::ip::tcp::socket& s,
                                          boost::asio::streambuf& buf, uint64_t size,
                                          const std::string& path);
// Moves every checkpoint file of `from` into `to` (replacing files of the same names).
size_t move_checkpoints(const std::string& from, const std::string& to);
void remove_checkpoints(const std::string& dir);

}  // namespace ddprun::agent::replica_io
