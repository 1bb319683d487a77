// SshProcess: one ssh client the launching ddprun started (a node's connection or a probe),
// with its streams wired as the fan-out needs them. Owns the ChildProcess (its own session
// and process group, SIGKILLed if ddprun dies), the write end of its stdin pipe, its pidfd
// and its stream pumps. Single-threaded: the io_context's thread only.
//
// Closing stdin is how a node is told to stop: ssh forwards the EOF, the remote ddprun
// (--stop-on-stdin-eof) stops its workers as on SIGTERM and exits, and ssh exits with its code.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/process/child_process.hpp"
#include "agent/process/stream_pump.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::launcher {

struct SshStreams {
  bool stdin_pipe = false;  // true: stdin is a pipe held here (close_stdin()); else inherited
  std::string line_prefix;  // non-empty: stdout/stderr to ours, line by line, with this prefix
  int stdout_fd = -1;       // without a prefix: these (-1: inherited)
  int stderr_fd = -1;
};

class SshProcess {
 public:
  using OnExit = std::function<void(agent::ExitStatus)>;

  // argv[0] must be a resolved path. Throws std::system_error if it cannot be started.
  SshProcess(boost::asio::io_context& io, const std::vector<std::string>& argv,
             const SshStreams& streams, OnExit on_exit);
  SshProcess(const SshProcess&) = delete;
  SshProcess& operator=(const SshProcess&) = delete;
  ~SshProcess();

  void close_stdin() { stdin_.reset(); }
  void kill() { child_.signal_group(SIGKILL); }
  bool running() const { return !child_.reaped(); }
  pid_t pid() const { return child_.pid(); }

 private:
  void watch_exit();
  void on_exited();

  sys::UniqueFd stdin_;
  std::shared_ptr<agent::StreamPump> out_;
  std::shared_ptr<agent::StreamPump> err_;
  agent::ChildProcess child_;
  boost::asio::posix::stream_descriptor pidfd_;
  OnExit on_exit_;
};

}  // namespace ddprun::launcher
