// HeartbeatSocket: the Unix datagram socket workers beat on. Every datagram is one beat,
// whatever it holds (empty is fine). Its sender is the pid the kernel attaches to it
// (SO_PASSCRED, read back as SCM_CREDENTIALS), never anything in the payload, so a process can
// only ever beat for itself.
//
// Reading is event-driven on the io_context: one async_wait for readability, then every queued
// datagram is drained with non-blocking recvmmsg before the next wait (past kMaxPerWakeup in
// one go, the rest is read after the io_context's other work, so a flood cannot hold the
// thread). After a drain that found beats, the socket rests for `coalesce` before it is read
// again: beats that arrive meanwhile queue up and are taken in one wake-up, so the agent wakes
// at most 1/coalesce times a second however many workers beat how often (while it rests,
// the socket is out of the reactor, so arrivals wake nobody). A beat's time is
// then late by at most `coalesce`; whoever judges a deadline calls read_queued() first. Workers
// send without blocking: when the queue is full (net.unix.max_dgram_qlen datagrams) their beat is
// dropped, never queued behind a stalled agent.
//
// Owns the socket and its filesystem name (mode 0600, unlinked on destruction). Called and
// calling back on the io_context's thread only. Safe to destroy with a wait pending.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/datagram_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "agent/hang/owned_path.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent {

class HeartbeatSocket {
 public:
  using Clock = std::chrono::steady_clock;
  // One call per datagram: the sender's pid (as seen in this pid namespace) and when the batch
  // it came in was read.
  using BeatCallback = std::function<void(pid_t sender, Clock::time_point at)>;

  static constexpr int kMaxPerWakeup = 1024;

  // Binds `path` and starts reading. A socket file left at `path` by a process that is gone
  // (nobody receives on it) is replaced; a live one is not. Throws std::system_error naming the
  // path (too long for sun_path, bind or socket option failures).
  HeartbeatSocket(boost::asio::io_context& io, const std::string& path, BeatCallback on_beat,
                  std::chrono::milliseconds coalesce = std::chrono::milliseconds(0));
  ~HeartbeatSocket();
  HeartbeatSocket(const HeartbeatSocket&) = delete;
  HeartbeatSocket& operator=(const HeartbeatSocket&) = delete;

  const std::string& path() const { return path_; }

  // Takes every beat queued now, at once (before judging a deadline).
  void read_queued();

 private:
  void wait();
  void drain();            // reads every queued datagram, then rests or waits again
  int receive(int limit);  // reads up to `limit` datagrams; -1 when the socket broke
  int fd() { return resting_ ? resting_.get() : socket_.native_handle(); }

  std::string path_;
  OwnedPath name_;  // declared before socket_: the socket closes before its name goes
  boost::asio::local::datagram_protocol::socket socket_;
  BeatCallback on_beat_;
  std::chrono::milliseconds coalesce_;
  boost::asio::steady_timer rest_;
  // While resting, the socket is taken out of the reactor (held here), or every datagram would
  // still wake the io_context's epoll_wait.
  sys::UniqueFd resting_;
  // Late completions (already queued when this object died) check this before touching it.
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace ddprun::agent
