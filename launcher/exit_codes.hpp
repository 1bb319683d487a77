// ddprun's exit status, decided here and nowhere else: the agent reports how the job ended
// (agent::JobResult) and main() exits with exit_code() of it; a bad command line exits with
// kExitUsage before anything starts.
//
//   code         | when
//   -------------+-------------------------------------------------------------------------
//   0            | success: every worker of the job exited 0
//   1            | ddprun failed, not a worker of this node: the rendezvous failed (too few
//                | nodes, store unreachable, job closed, port in use), the rendezvous store
//                | was lost, the workers could not be started, or the job failed on another
//                | node
//   2            | bad command line (one line "ddprun: error: ..."), nothing was started
//   124          | a worker of this node hung (no heartbeat for --hang-timeout, or a
//                | FileTimer scope expired) and no restarts are left; as timeout(1) says
//                | a command timed out. Its stacks are in the attempt's log directory
//   128 + N      | ddprun received signal N (143 for SIGTERM); the workers were stopped
//   otherwise    | a worker of this node was the root cause, and ddprun exits as a shell
//                | reports it (ExitStatus::shell_code()): its exit code, 128 + the signal
//                | that killed it, 127 when it could not be executed
//
// A worker's own code may coincide with one of ddprun's (a worker exiting 2, or killed by
// SIGTERM): the failure summary on stderr says which it was.
#pragma once

#include "agent/agent.hpp"

namespace ddprun::launcher {

inline constexpr int kExitSuccess = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitHang = 124;
inline constexpr int kExitSignalBase = 128;  // + the signal number

int exit_code(const agent::JobResult& result);

}  // namespace ddprun::launcher
