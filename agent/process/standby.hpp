// A standby worker for in-process recovery (--in-process-recovery, agent/in_process_recovery.hpp):
// the entrypoint (a binary on the worker SDK) started ahead of need with the first worker's
// argument list and environment plus DDPRUN_STANDBY_FD=4, a control socket. It loads its
// libraries (LibTorch: about half a second) and then waits in ddprun::init_process_group() until
// the agent hands it a dead worker's place: that worker's whole environment and its stdout and
// stderr descriptors, in one message. It then is that worker, without the load.
//
// The standby writes nothing before it is used (its stdout and stderr are /dev/null); what the
// program does before init_process_group() runs in it ahead of time, so read RANK and the rest
// after that call. Closing the socket (the destructor, or the agent's death) makes it exit 0.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/process/child_process.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent {

class Guardian;

class Standby {
 public:
  // Spawns it. Throws std::system_error.
  Standby(const std::string& program, std::vector<std::string> argv, std::vector<std::string> env,
          const std::vector<int>& reset_signals, Guardian* guardian);
  ~Standby();  // kills and reaps it unless taken
  Standby(const Standby&) = delete;
  Standby& operator=(const Standby&) = delete;

  pid_t pid() const { return child_ ? child_->pid() : -1; }
  bool taken() const { return taken_; }
  const std::vector<std::string>& argv() const { return argv_; }

  // Makes it the worker of `env` with these stdout/stderr descriptors (-1: ddprun's own) and
  // hands over the process; nullopt when it cannot serve (it died, or the message failed).
  std::optional<ChildProcess> take(const std::vector<std::string>& env, int stdout_fd,
                                   int stderr_fd);

 private:
  std::vector<std::string> argv_;
  sys::UniqueFd control_;
  std::optional<ChildProcess> child_;
  Guardian* guardian_;
  bool taken_ = false;
};

}  // namespace ddprun::agent
