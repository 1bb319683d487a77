#include "agent/worker_group.hpp"

#include <stdexcept>

namespace ddprun::agent {

std::string_view to_string(WorkerState state) {
  switch (state) {
    case WorkerState::kInit:
      return "INIT";
    case WorkerState::kHealthy:
      return "HEALTHY";
    case WorkerState::kUnhealthy:
      return "UNHEALTHY";
    case WorkerState::kStopped:
      return "STOPPED";
    case WorkerState::kSucceeded:
      return "SUCCEEDED";
    case WorkerState::kFailed:
      return "FAILED";
  }
  return "UNKNOWN";
}

bool is_valid_transition(WorkerState from, WorkerState to) {
  using S = WorkerState;
  switch (from) {
    case S::kInit:
      return to == S::kHealthy || to == S::kStopped || to == S::kFailed;
    case S::kHealthy:
      return to == S::kSucceeded || to == S::kUnhealthy || to == S::kStopped;
    case S::kUnhealthy:
      return to == S::kStopped;
    case S::kStopped:
      return to == S::kInit || to == S::kFailed;
    case S::kSucceeded:
    case S::kFailed:
      return false;
  }
  return false;
}

void WorkerGroup::set_state(WorkerState to) {
  if (!is_valid_transition(state_, to)) {
    throw std::logic_error("invalid worker group transition " + std::string(to_string(state_)) +
                           " -> " + std::string(to_string(to)));
  }
  state_ = to;
}

void WorkerGroup::assign_ranks(int base_global_rank, int world_size) {
  workers.clear();
  for (int local_rank = 0; local_rank < spec_->local_world_size; ++local_rank) {
    Worker w;
    w.local_rank = local_rank;
    w.global_rank = base_global_rank + local_rank;
    w.role_rank = w.global_rank;
    w.world_size = world_size;
    w.role_world_size = world_size;
    workers.push_back(w);
  }
}

}  // namespace ddprun::agent
