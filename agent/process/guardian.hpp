// Guardian: makes sure no worker or worker's child outlives ddprun, whatever kills ddprun.
//
// PR_SET_PDEATHSIG only kills a worker itself, not the processes it started (DataLoader
// workers, a shell's children). So at startup, before any thread or worker exists, ddprun
// forks a tiny guardian process that holds the read end of a pipe whose write end only ddprun
// holds (close-on-exec, and closed in every worker before exec). ddprun tells it the process
// group of each worker as it is spawned and reaped. When the guardian reads EOF — ddprun
// exited or died by any means, SIGKILL included — it SIGKILLs every process group still
// registered and exits. The guardian runs in its own session and ignores every catchable
// signal, so neither a terminal's Ctrl-C nor a kill of ddprun's process group reaches it.
//
// The guardian also holds one "last request" (set_exit_request): text it hands to the exit
// action given at start when ddprun is gone, before it kills the groups (bounded by 1 s). The etcd
// rendezvous uses it to revoke the agent's lease, so the other nodes notice a killed agent at once.
//
// And it removes one directory tree when ddprun is gone (remove_at_exit): the job's in-memory
// checkpoints, which would otherwise hold memory until the next reboot.
//
// Single-threaded: call from the agent's thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>

#include "store/sys/fd.hpp"

namespace ddprun::agent {

class Guardian {
 public:
  // Runs in the guardian once ddprun is gone, with the last exit request (never an empty one).
  using ExitAction = bool (*)(const std::string& request, std::chrono::milliseconds timeout);

  // Forks the guardian. Call before starting threads. Throws std::system_error.
  static std::unique_ptr<Guardian> start(ExitAction action = nullptr);

  // Closes the pipe (the guardian kills whatever is still registered) and reaps it.
  ~Guardian();

  void watch(pid_t pgid);    // a worker's process group now exists
  void unwatch(pid_t pgid);  // ...and has been killed and reaped
  // Replaces the exit request ("" = none).
  void set_exit_request(const std::string& request);
  // Replaces the directory removed (recursively, after the groups are killed) once ddprun is
  // gone ("" = none).
  void remove_at_exit(const std::string& directory);

  pid_t pid() const { return pid_; }

 private:
  Guardian(pid_t pid, sys::UniqueFd pipe) : pid_(pid), pipe_(std::move(pipe)) {}
  void send(int32_t record);
  void send_bytes(const char* data, size_t size);
  void send_text(int32_t kind, const std::string& text);

  pid_t pid_;
  sys::UniqueFd pipe_;
  bool warned_ = false;
};

}  // namespace ddprun::agent
