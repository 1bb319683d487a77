// Agent: supervises the local worker group (after torchelastic's SimpleElasticAgent).
//
// Loop: rendezvous (a fresh store per attempt) -> start workers -> wait for an event:
//   * every worker exited 0            -> SUCCEEDED, exit 0
//   * a worker exited non-zero         -> UNHEALTHY: log it, stop the others (SIGTERM to each
//                                         process group, --shutdown-timeout grace, SIGKILL,
//                                         reap), then restart the group if --max-restarts
//                                         allow (TORCHELASTIC_RESTART_COUNT + 1), else FAILED:
//                                         print the failure summary and exit with the root
//                                         cause's exit code (128 + signal if it was killed)
//   * a signal in --signals-to-handle  -> forward it to every worker's process group, grace,
//                                         SIGKILL, reap, exit 128 + signal. A second signal
//                                         skips the grace.
// Everything is event-driven on one io_context: pidfds for exits, a signal_set for signals,
// a timer only for the grace period. No threads besides the caller's.
//
// A person sees one line when the workers start (world size, store, attempt), one per
// failure and restart, and the summary at the end; all on stderr, prefixed "[ddprun] host:pid".
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>

#include "agent/rendezvous.hpp"
#include "agent/worker_spec.hpp"

namespace ddprun::agent {

class Guardian;

class Agent {
 public:
  // `guardian` may be null (tests). The rendezvous handler must use the same io_context.
  Agent(boost::asio::io_context& io, WorkerSpec spec, std::unique_ptr<RendezvousHandler> rdzv,
        Guardian* guardian);
  ~Agent();

  // Runs the job to the end on the calling thread; returns ddprun's exit code.
  int run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
