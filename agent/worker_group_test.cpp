#include "agent/worker_group.hpp"

#include <gtest/gtest.h>

namespace ddprun::agent {
namespace {

TEST(WorkerGroup, RanksComeFromTheRound) {
  WorkerSpec spec;
  spec.local_world_size = 3;
  WorkerGroup g(spec, "job");
  RendezvousInfo round;
  round.base_global_rank = 4;
  round.world_size = 10;
  round.restart_count = 2;
  round.max_restarts = 5;
  g.assign(round);
  ASSERT_EQ(g.workers().size(), 3u);
  EXPECT_EQ(g.workers()[2].local_rank, 2);
  EXPECT_EQ(g.workers()[2].global_rank, 6);
  EXPECT_EQ(g.workers()[2].role_rank, 6);
  EXPECT_EQ(g.workers()[2].world_size, 10);
  EXPECT_EQ(g.round().restart_count, 2);
  EXPECT_EQ(g.round().max_restarts, 5);
  EXPECT_EQ(g.run_id(), "job");
  EXPECT_EQ(g.state(), WorkerState::kInit);
}

}  // namespace
}  // namespace ddprun::agent
