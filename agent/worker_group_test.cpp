#include "agent/worker_group.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace ddprun::agent {
namespace {

TEST(WorkerGroup, StateMachineFollowsTheDiagram) {
  WorkerSpec spec;
  WorkerGroup g(spec);
  EXPECT_EQ(g.state(), WorkerState::kInit);
  g.set_state(WorkerState::kHealthy);
  g.set_state(WorkerState::kUnhealthy);
  g.set_state(WorkerState::kStopped);
  g.set_state(WorkerState::kInit);
  g.set_state(WorkerState::kHealthy);
  g.set_state(WorkerState::kSucceeded);
  EXPECT_THROW(g.set_state(WorkerState::kHealthy), std::logic_error);
  EXPECT_FALSE(is_valid_transition(WorkerState::kUnhealthy, WorkerState::kInit));
  EXPECT_EQ(to_string(WorkerState::kUnhealthy), "UNHEALTHY");
}

TEST(WorkerGroup, RanksArePrefixSums) {
  WorkerSpec spec;
  spec.local_world_size = 3;
  WorkerGroup g(spec);
  g.assign_ranks(4, 10);
  ASSERT_EQ(g.workers.size(), 3u);
  EXPECT_EQ(g.workers[2].local_rank, 2);
  EXPECT_EQ(g.workers[2].global_rank, 6);
  EXPECT_EQ(g.workers[2].role_rank, 6);
  EXPECT_EQ(g.workers[2].world_size, 10);
}

}  // namespace
}  // namespace ddprun::agent
