#include "agent/worker_group.hpp"

namespace ddprun::agent {

void WorkerGroup::assign(const RendezvousInfo& round) {
  round_ = round;
  workers_.clear();
  for (int local_rank = 0; local_rank < spec_->local_world_size; ++local_rank) {
    Worker w;
    w.local_rank = local_rank;
    w.global_rank = round.base_global_rank + local_rank;
    w.role_rank = w.global_rank;
    w.world_size = round.world_size;
    w.role_world_size = round.world_size;
    workers_.push_back(w);
  }
}

}  // namespace ddprun::agent
