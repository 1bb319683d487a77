// WorkerGroup and WorkerState: what runs on this node now (after torchelastic's WorkerGroup).
//
// The local group moves through the states as one:
//
//   INIT ──rendezvous, spawn──▶ HEALTHY ──all exited 0──▶ SUCCEEDED
//                                  │
//                                  ├─ a worker exited non-zero ─▶ UNHEALTHY ─ stop ─▶ STOPPED
//                                  │                                                    │
//                                  │      restarts left: restart_count + 1, back to INIT ◀┘
//                                  │      none left: FAILED
//                                  └─ the agent got a signal ─▶ STOPPED (forwarded, then exit)
//
// HEALTHY means every worker is running or has exited 0. UNHEALTHY lasts from the first
// failure until the survivors are stopped (signal, grace, SIGKILL, reaped).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "agent/worker_spec.hpp"

namespace ddprun::agent {

enum class WorkerState { kInit, kHealthy, kUnhealthy, kStopped, kSucceeded, kFailed };

std::string_view to_string(WorkerState state);

// Whether `from -> to` is one of the transitions drawn above.
bool is_valid_transition(WorkerState from, WorkerState to);

struct Worker {
  int local_rank = 0;
  int global_rank = 0;  // RANK: base of this node + local rank
  int role_rank = 0;    // ROLE_RANK (one role per job: equals RANK)
  int world_size = 0;
  int role_world_size = 0;
  pid_t pid = -1;  // -1 until spawned
};

class WorkerGroup {
 public:
  explicit WorkerGroup(const WorkerSpec& spec) : max_restarts(spec.max_restarts), spec_(&spec) {}

  const WorkerSpec& spec() const { return *spec_; }
  WorkerState state() const { return state_; }
  // Moves to `to`; throws std::logic_error on a transition the diagram does not allow.
  void set_state(WorkerState to);

  // Filled from each rendezvous.
  int group_rank = 0;
  int group_world_size = 1;
  int restart_count = 0;
  int max_restarts = 0;  // TORCHELASTIC_MAX_RESTARTS: the job's budget (multi-node: the store's)
  std::string master_addr;
  int master_port = 0;
  std::string run_id;
  bool use_agent_store = true;
  std::vector<Worker> workers;

  // Assigns ranks for a rendezvous result: ranks are base_global_rank + local_rank.
  void assign_ranks(int base_global_rank, int world_size);

 private:
  const WorkerSpec* spec_;
  WorkerState state_ = WorkerState::kInit;
};

}  // namespace ddprun::agent
