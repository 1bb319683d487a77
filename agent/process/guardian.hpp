// Guardian: makes sure no worker or worker's child outlives ddprun, whatever kills ddprun.
//
// PR_SET_PDEATHSIG only kills a worker itself, not the processes it started (DataLoader
// workers, a shell's children). So ddprun starts a tiny guardian process that holds the read
// end of a pipe whose write end only ddprun holds (close-on-exec, and closed in every worker
// before exec). ddprun tells it the process group of each worker as it is spawned and reaped.
// When the guardian reads EOF — ddprun exited or died by any means, SIGKILL included — it
// SIGKILLs every process group still registered and exits. The guardian runs in its own
// session and ignores every catchable signal, so neither a terminal's Ctrl-C nor a kill of
// ddprun's process group reaches it.
//
// Two owners, so that no single kill leaves the workers' children behind:
//  - The guardian is this binary executed again, under another name: its command line is
//    `orphan-guardian <ddprun's pid>` and its process name `orphan-guardian`, so what kills
//    ddprun by name or pattern (`pkill -f ddprun`, `killall ddprun`, `pkill -f train.py`)
//    leaves it to do its work. (Where /proc/self/exe is not ddprun — run under valgrind or
//    ld.so — the replacement of one that died at once is a plain copy of ddprun, renamed
//    the same way.)
//  - ddprun watches its guardian (keep()): one that dies is replaced at once and told
//    everything the old one knew, so killing the guardian first and ddprun next is covered.
// What is not: both killed in the same instant by their pids. A scheduler's cgroup (Slurm,
// Kubernetes, systemd) covers that.
//
// The guardian also holds one "last request" (set_exit_request): text it hands to the exit
// action when ddprun is gone, before it kills the groups (bounded by 1 s). The etcd rendezvous
// uses it to revoke the agent's lease, so the other nodes notice a killed agent at once.
//
// And it removes one directory tree when ddprun is gone (remove_at_exit): the job's in-memory
// checkpoints, which would otherwise hold memory until the next reboot.
//
// Single-threaded: call from the agent's thread.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "store/sys/fd.hpp"

namespace ddprun::agent {

class Guardian {
 public:
  // Runs in the guardian once ddprun is gone, with the last exit request (never an empty one).
  using ExitAction = bool (*)(const std::string& request, std::chrono::milliseconds timeout);

  // Call first in main: in a guardian ddprun started, runs it with `action` and never
  // returns; in ddprun itself, returns at once.
  static void run_if_guardian(ExitAction action);

  // Starts the guardian (this binary again, see above). Throws std::system_error.
  static std::unique_ptr<Guardian> start();

  // Closes the pipe (the guardian kills whatever is still registered) and reaps it.
  ~Guardian();

  // From now on, a guardian that dies is replaced (through `io`, the agent's loop).
  void keep(boost::asio::io_context& io);

  void watch(pid_t pgid);    // a worker's process group now exists
  void unwatch(pid_t pgid);  // ...and has been killed and reaped
  // Replaces the exit request ("" = none).
  void set_exit_request(const std::string& request);
  // Replaces the directory removed (recursively, after the groups are killed) once ddprun is
  // gone ("" = none).
  void remove_at_exit(const std::string& directory);

  pid_t pid() const { return pid_; }

 private:
  Guardian() = default;
  // A new guardian process (this binary executed again, or, with !exec, a plain copy of this
  // process), told what this object knows.
  void launch(bool exec);
  void await_exit();  // arms the wait on the guardian's pidfd
  void on_exit();
  void send(int32_t record);
  void send_bytes(const char* data, size_t size);
  void send_text(int32_t kind, const std::string& text);

  pid_t pid_ = -1;
  sys::UniqueFd pipe_;
  boost::asio::io_context* io_ = nullptr;  // keep()'s
  std::chrono::steady_clock::time_point launched_;
  bool exec_ = true;  // how the current one was launched
  std::unique_ptr<boost::asio::posix::stream_descriptor> pidfd_;
  bool warned_ = false;
  // What the guardian was told, for a replacement.
  std::set<pid_t> groups_;
  std::string exit_request_;
  std::string remove_dir_;
};

}  // namespace ddprun::agent
