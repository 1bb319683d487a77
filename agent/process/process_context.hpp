// ProcessContext: the processes of one attempt and their streams (after torchelastic's
// PContext). Spawns every worker of the local group, wires its stdout/stderr (inherited,
// /dev/null, a log file, or a tee pipe read on the io_context), and notices each exit at once
// through the worker's pidfd (asio stream_descriptor async_wait: no polling, no SIGCHLD).
//
// On an exit it kills what is left of the worker's process group, reaps the worker, drains
// its streams, records the exit and calls the exit callback.
//
// Threads: construct, call and destroy on the io_context's thread. Destroying a context
// SIGKILLs and reaps any worker still running.
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

namespace ddprun::agent {

class Guardian;

// Where one standard stream of a worker goes.
struct StreamTarget {
  enum class Kind { kInherit, kDevNull, kFile, kTee };
  Kind kind = Kind::kInherit;
  std::string path;     // kFile, kTee: the log file
  int console_fd = -1;  // kTee: ddprun's stdout/stderr, or -1 (file only, filtered out)
  std::string prefix;   // kTee: console line prefix
  std::shared_ptr<sys::UniqueFd> filtered_file;  // kTee: --duplicate-*-filters destination
  std::vector<std::string> filters;
};

struct WorkerLaunch {
  int local_rank = 0;
  int global_rank = 0;
  std::vector<std::string> argv;  // argv[0] first, ${local_rank} already substituted
  std::vector<std::string> env;   // "NAME=value"
  std::string error_file;         // TORCHELASTIC_ERROR_FILE
  StreamTarget out;
  StreamTarget err;
};

struct WorkerExit {
  ExitStatus status;
  int64_t unix_time = 0;  // when ddprun saw it (seconds)
  uint64_t sequence = 0;  // order of observation across the attempt
};

class ProcessContext {
 public:
  using ExitCallback = std::function<void(int local_rank)>;

  // `guardian` may be null (unit tests).
  ProcessContext(boost::asio::io_context& io, Guardian* guardian, ExitCallback on_exit);
  ~ProcessContext();
  ProcessContext(const ProcessContext&) = delete;
  ProcessContext& operator=(const ProcessContext&) = delete;

  // Spawns one process per launch, in order. Throws std::system_error (log file, pipe, fork):
  // the workers already started are killed and reaped by the destructor.
  void start(const std::string& program, std::vector<WorkerLaunch> launches,
             const std::vector<int>& reset_signals);

  // Sends `sig` to the process group of every worker not yet reaped.
  void signal_all(int sig);

  size_t size() const { return slots_.size(); }
  size_t running() const;
  bool all_exited() const { return running() == 0; }
  const std::optional<WorkerExit>& exit_of(int local_rank) const;
  pid_t pid_of(int local_rank) const;
  const WorkerLaunch& launch_of(int local_rank) const;

 private:
  struct Slot;
  void watch_exit(size_t index);
  void on_exit(size_t index);

  boost::asio::io_context& io_;
  Guardian* guardian_;
  ExitCallback on_exit_;
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t sequence_ = 0;
  std::shared_ptr<char> alive_ = std::make_shared<char>();  // guards late handlers
};

}  // namespace ddprun::agent
