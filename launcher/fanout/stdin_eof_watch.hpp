// StdinEofWatch: `--stop-on-stdin-eof`, the remote side of a launch over ssh. The launching
// ddprun holds the write end of this ddprun's stdin (through ssh); when it closes it, or its
// ssh client dies, or the connection drops, sshd closes our stdin and we stop the job exactly
// as SIGTERM would: the watch sends SIGTERM to this process, which the agent's signal_set
// handles (forward to the workers, grace, SIGKILL, exit 143).
//
// Takes over stdin at construction: a private copy is watched and fd 0 becomes /dev/null, so
// workers never read (or hold open) the ssh channel. Bytes that arrive are discarded. Lives
// on the agent's io_context; construct it before Agent::run() and keep it until after.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <vector>

namespace ddprun::launcher {

class StdinEofWatch {
 public:
  explicit StdinEofWatch(boost::asio::io_context& io);
  StdinEofWatch(const StdinEofWatch&) = delete;
  StdinEofWatch& operator=(const StdinEofWatch&) = delete;

 private:
  void arm();
  bool drain();  // false at EOF or on an error

  boost::asio::posix::stream_descriptor in_;
  std::vector<char> buffer_;
  bool fired_ = false;
};

}  // namespace ddprun::launcher
