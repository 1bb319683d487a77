// WorkerGroup: what runs on this node now (after torchelastic's WorkerGroup): the round the
// workers belong to, their ranks, and the group's state (state_machine.hpp). The round
// (RendezvousInfo) is the one source of ranks, the store's address and the restart count and
// budget: the group keeps it as given and computes nothing of its own.
#pragma once

#include <string>
#include <vector>

#include "agent/rendezvous/rendezvous.hpp"
#include "agent/state_machine.hpp"
#include "agent/worker_spec.hpp"

namespace ddprun::agent {

struct Worker {
  int local_rank = 0;
  int global_rank = 0;  // RANK: base of this node + local rank
  int role_rank = 0;    // ROLE_RANK (one role per job: equals RANK)
  int world_size = 0;
  int role_world_size = 0;
};

// Where the workers reach this agent (agent/hang/): exported as DDPRUN_HEARTBEAT_SOCKET and
// TORCHELASTIC_TIMER_FILE. Empty: not served.
struct AgentEndpoints {
  std::string heartbeat_socket;
  std::string timer_file;
  std::string memory_checkpoint_dir;  // with its bound in bytes
  uint64_t memory_checkpoint_limit = 0;
};

class WorkerGroup {
 public:
  WorkerGroup(const WorkerSpec& spec, std::string run_id)
      : spec_(&spec), run_id_(std::move(run_id)) {}

  const WorkerSpec& spec() const { return *spec_; }
  const std::string& run_id() const { return run_id_; }  // TORCHELASTIC_RUN_ID
  const RendezvousInfo& round() const { return round_; }
  const std::vector<Worker>& workers() const { return workers_; }

  // A new round: ranks are round.base_global_rank + local rank.
  void assign(const RendezvousInfo& round);

  const AgentEndpoints& endpoints() const { return endpoints_; }
  void set_endpoints(AgentEndpoints e) { endpoints_ = std::move(e); }

  // In-process recovery spent a restart without a new round (the handler counted it).
  void set_restart_count(int count) { round_.restart_count = count; }

  WorkerState state() const { return state_; }
  void set_state(WorkerState to) { state_ = to; }

 private:
  const WorkerSpec* spec_;
  std::string run_id_;
  RendezvousInfo round_;
  std::vector<Worker> workers_;
  AgentEndpoints endpoints_;
  WorkerState state_ = WorkerState::kInit;
};

}  // namespace ddprun::agent
