#include "ddprun/join.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddprun/data_parallel.hpp"
#include "test_ranks.hpp"

namespace ddprun {
namespace {

using ::testing::HasSubstr;
using testing::errors_of_ranks;
using testing::run_ranks;

std::shared_ptr<ProcessGroup> borrowed(ProcessGroup& pg) {
  return std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {});
}

torch::nn::Sequential make_net() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(5, 6), torch::nn::Tanh(), torch::nn::Linear(6, 2));
}

// Trains rank r on steps[r] batches under a Join; returns each rank's final parameters.
std::vector<std::vector<torch::Tensor>> train_uneven(const std::vector<int>& steps,
                                                     DdpOptions options, JoinOptions jo = {}) {
  const int world = static_cast<int>(steps.size());
  std::vector<std::vector<torch::Tensor>> out(world);
  run_ranks(world, [&](int rank, ProcessGroup& pg) {
    auto net = make_net();
    DistributedDataParallel ddp(net, borrowed(pg), options);
    torch::optim::SGD opt(net->parameters(), 0.05);
    join({&ddp}, [&] {
      for (int s = 0; s < steps[rank]; ++s) {
        auto x = torch::full({3, 5}, 0.1 * (s + 1) + rank);
        opt.zero_grad();
        ddp(x).pow(2).sum().backward();
        opt.step();
      }
    }, jo);
    for (const auto& p : net->parameters()) out[rank].push_back(p.detach().clone());
  });
  return out;
}

void expect_all_equal(const std::vector<std::vector<torch::Tensor>>& params) {
  for (size_t r = 1; r < params.size(); ++r) {
    for (size_t i = 0; i < params[0].size(); ++i) {
      EXPECT_TRUE(torch::equal(params[0][i], params[r][i])) << "rank " << r << " tensor " << i;
    }
  }
}

TEST(Join, UnevenInputsFinishWithOneModelOnEveryTransport) {
  DdpOptions shm;  // same host: shared memory
  DdpOptions gloo;
  gloo.shared_memory = false;
  DdpOptions small = gloo;
  small.first_bucket_cap_bytes = 64;  // several buckets
  small.bucket_cap_bytes = 64;
  for (const DdpOptions& o : {shm, gloo, small}) {
    expect_all_equal(train_uneven({2, 5, 3}, o));
  }
}

TEST(Join, LastJoinerSeesTheSameSumAsWithoutJoin) {
  // Rank 1 trains 3 steps, rank 0 one: steps 2 and 3 average rank 1's gradient with rank 0's
  // zeros, i.e. half of it. Dividing by the ranks still training instead gives all of it.
  DdpOptions o;
  o.shared_memory = false;
  auto half = train_uneven({1, 3}, o);
  JoinOptions by_training;
  by_training.divide_by_initial_world_size = false;
  auto full = train_uneven({1, 3}, o, by_training);
  expect_all_equal(half);
  expect_all_equal(full);
  EXPECT_FALSE(torch::allclose(half[0][0], full[0][0]));
}

TEST(Join, ThrowOnEarlyTerminationStopsEveryRank) {
  JoinOptions jo;
  jo.throw_on_early_termination = true;
  auto errors = errors_of_ranks(2, [&](int rank, ProcessGroup& pg) {
    auto net = make_net();
    DistributedDataParallel ddp(net, borrowed(pg));
    join({&ddp}, [&] {
      for (int s = 0; s < (rank == 0 ? 1 : 4); ++s) ddp(torch::ones({2, 5})).sum().backward();
    }, jo);
  });
  EXPECT_THAT(errors[0], HasSubstr("this rank ran out of inputs"));
  EXPECT_THAT(errors[1], HasSubstr("1 rank(s) ran out of inputs"));
}

TEST(Join, RejectsMisuse) {
  run_ranks(1, [&](int, ProcessGroup& pg) {
    auto net = make_net();
    DistributedDataParallel ddp(net, borrowed(pg));
    EXPECT_THROW(Join({}), Error);
    EXPECT_THROW(Join({nullptr}), Error);
    Join outer({&ddp});
    EXPECT_THROW(Join({&ddp}), Error);  // one Join at a time
    outer.finish();
    EXPECT_THROW(outer.finish(), Error);
    EXPECT_THROW(ddp(torch::ones({1, 5})), Error);  // a forward after finish()
  });
}

}  // namespace
}  // namespace ddprun
