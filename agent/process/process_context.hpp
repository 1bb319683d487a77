// ProcessContext: the processes of one attempt and their streams (after torchelastic's
// PContext). Spawns every worker of the local group, wires its stdout/stderr (inherited,
// /dev/null, a log file, or a tee pipe read on the io_context), and notices each exit at once
// through the worker's pidfd (asio stream_descriptor async_wait: no polling, no SIGCHLD).
//
// On an exit it kills what is left of the worker's process group, reaps the worker, drains
// its streams, records the exit (with the worker's peak RSS, and for a SIGKILL who sent it:
// kill_cause.hpp) and calls the exit callback.
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
#include "agent/process/kill_cause.hpp"
#include "agent/process/stream_pump.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent {

class Guardian;

// Where one standard stream of a worker goes.
struct StreamTarget {
  enum class Kind { kInherit, kDevNull, kFile, kTee };
  Kind kind = Kind::kInherit;
  std::string path;     // kFile, kTee: the log file
  bool append = false;  // kFile, kTee: after what is there (a replaced worker's), not over it
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
  int64_t unix_time = 0;     // when ddprun saw it (seconds)
  uint64_t sequence = 0;     // order of observation across the attempt
  uint64_t peak_rss_kb = 0;  // its peak resident set (0: unknown)
  std::string cause;         // a SIGKILL's sender: "killed by the kernel's OOM killer (...)"
};

class ProcessContext {
 public:
  using ExitCallback = std::function<void(int local_rank)>;

  // `guardian` and `causes` (which explains SIGKILLs) may be null (unit tests); both must
  // outlive the context.
  ProcessContext(boost::asio::io_context& io, Guardian* guardian, ExitCallback on_exit,
                 KillCauses* causes = nullptr);
  ~ProcessContext();
  ProcessContext(const ProcessContext&) = delete;
  ProcessContext& operator=(const ProcessContext&) = delete;

  // Another way to start a worker than fork+exec of `program` (the warm-start zygote): given
  // the launch and its stdout/stderr descriptors (-1: inherit), the process, or nullopt to
  // start it cold.
  using WarmSpawn = std::function<std::optional<ChildProcess>(const WorkerLaunch& launch,
                                                              int stdout_fd, int stderr_fd)>;

  // Spawns one process per launch, in order (through `warm` first, when given). Throws
  // std::system_error (log file, pipe, fork): the workers already started are killed and
  // reaped by the destructor.
  void start(const std::string& program, std::vector<WorkerLaunch> launches,
             const std::vector<int>& reset_signals, const WarmSpawn& warm = {});
  // Starts `local_rank`'s worker again (in-process recovery: the others keep running) from
  // `launch`, through `ready` first when given (a standby). Only for a worker that has exited;
  // its exit record is dropped. Throws as start() does; the worker then stays as it was.
  void respawn(int local_rank, const std::string& program, WorkerLaunch launch,
               const std::vector<int>& reset_signals, const WarmSpawn& ready = {});
  // How many of the running attempt's workers were started warm.
  size_t warm_started() const { return warm_started_; }

  // Sends `sig` to the process group of every worker not yet reaped. A SIGKILL's `why` ("after
  // the stop grace expired") is what the exit's cause will say ddprun sent it for.
  void signal_all(int sig, const std::string& why = "");

  size_t size() const { return slots_.size(); }
  size_t running() const;
  bool all_exited() const { return running() == 0; }
  const std::optional<WorkerExit>& exit_of(int local_rank) const;
  pid_t pid_of(int local_rank) const;
  const WorkerLaunch& launch_of(int local_rank) const;

 private:
  struct Slot;
  void spawn(size_t index, const std::string& program, const std::vector<int>& reset_signals,
             const WarmSpawn& warm);
  void watch_exit(size_t index);
  void on_exit(size_t index);

  boost::asio::io_context& io_;
  Guardian* guardian_;
  ExitCallback on_exit_;
  KillCauses* causes_;
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t sequence_ = 0;
  size_t warm_started_ = 0;
  std::shared_ptr<char> alive_ = std::make_shared<char>();  // guards late handlers
};

}  // namespace ddprun::agent
