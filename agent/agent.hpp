// Agent: supervises the local worker group (after torchelastic's SimpleElasticAgent).
//
// Loop: rendezvous (a fresh workers' store per round) -> start workers -> wait for an event:
//   * every worker exited 0            -> the exit barrier (multi-node: until every node's
//                                         workers did) -> SUCCEEDED, exit 0
//   * a worker exited non-zero         -> UNHEALTHY: log it, tell the other nodes, stop the
//                                         others (SIGTERM to each process group,
//                                         --shutdown-timeout grace, SIGKILL, reap), then
//                                         restart the group if the restart budget allows
//                                         (TORCHELASTIC_RESTART_COUNT + 1, the same on every
//                                         node), else FAILED: print the failure summary and
//                                         exit with the root cause's exit code (128 + signal
//                                         if it was killed)
//   * another node ended the round     -> stop the workers; a node joined or died: re-form
//     (multi-node)                        without spending a restart; another node's worker
//                                         failed: as above; the store was lost: exit 1
//   * a worker hung (no heartbeat for --hang-timeout, a FileTimer scope expired): its stacks
//     are captured into the attempt's log directory, then as a failed worker
//   * a worker exited 0 and another has not --exit-timeout later: its stacks are captured,
//     it is stopped, and the attempt counts as succeeded (the work is done)
//   * a signal in --signals-to-handle  -> forward it to every worker's process group, grace,
//                                         SIGKILL, reap, exit 128 + signal. A second signal
//                                         skips the grace.
// Everything is event-driven on one io_context: pidfds for exits, a signal_set for signals,
// the rendezvous handler's round events, timers only for real timeouts.
//
// A person sees one line when the workers start (world size, store, attempt), one per
// rendezvous round, failure and restart, and the summary at the end; all on stderr, prefixed
// "[ddprun] host:pid".
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>
#include <optional>
#include <string>

#include "agent/process/exit_status.hpp"
#include "agent/rendezvous/rendezvous.hpp"
#include "agent/worker_spec.hpp"

namespace ddprun::agent {

class Guardian;

// How the job ended for this node. The launcher turns it into ddprun's exit code, in one
// table (launcher/exit_codes.hpp); the agent decides no exit codes itself.
struct JobResult {
  enum class Kind {
    kSucceeded,         // every worker of the job exited 0 (or the job finished without us)
    kWorkersFailed,     // a worker failed and no restarts are left; root_cause is set when it
                        // was one of this node's workers (the summary was printed)
    kWorkerHung,        // as kWorkersFailed, and the root cause was one of this node's workers
                        // found hung (no heartbeat, an expired FileTimer scope)
    kSignaled,          // ddprun received `signal`; the workers were stopped
    kRendezvousFailed,  // no round could be formed: too few nodes, an unreachable or
                        // unusable store, a closed job, a port in use
    kStoreLost,         // the rendezvous store went away while the job ran
    kStartFailed,       // the workers could not be started (log directory, fork)
  };
  Kind kind = Kind::kSucceeded;
  std::optional<ExitStatus> root_cause;  // kWorkersFailed
  int signal = 0;                        // kSignaled
  std::string what;  // the one-line reason: the launcher prints it with the exit code
};

class Agent {
 public:
  // `guardian` may be null (tests). The rendezvous handler must use the same io_context.
  Agent(boost::asio::io_context& io, WorkerSpec spec, std::unique_ptr<RendezvousHandler> rdzv,
        Guardian* guardian);
  ~Agent();

  // Runs the job to the end on the calling thread.
  JobResult run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
