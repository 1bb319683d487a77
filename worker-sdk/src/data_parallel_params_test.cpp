// DistributedDataParallel and the parameters it is given: unused parameters
// (find_unused_parameters, static_graph), buckets rebuilt in rank 0's ready order, parameters
// given new storage or replaced after wrapping.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp_test_net.hpp"
#include "ddprun/data_parallel.hpp"
#include "test_ranks.hpp"

namespace ddprun {
namespace {

using testing::errors_of_ranks;
using ::testing::HasSubstr;
using testing::run_ranks;
using testing::dp::grads_of;
using testing::dp::make_net;
using testing::dp::Net;

// Rank 1 alone uses net->unused (its gradient of sum(W 1 + b) is all ones): both ranks get half
// of it, as PyTorch's find_unused_parameters gives; with nobody using it, .grad stays undefined.
void run_find_unused(DdpOptions options, int steps) {
  std::vector<Net> nets{make_net(1, 5, true), make_net(1, 5, true)};
  run_ranks(2, [&](int rank, ProcessGroup& pg) {
    Net net = nets[rank];
    DistributedDataParallel ddp(net, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}),
                                options);
    for (int s = 0; s < steps; ++s) {
      for (auto& p : net->parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
      auto loss = torch::mse_loss(ddp(torch::ones({2, 6})), torch::zeros({2, 3}));
      if (rank == 1) loss = loss + net->unused(torch::ones({1, 3})).sum();
      loss.backward();
      ASSERT_TRUE(net->unused->weight.grad().defined()) << "rank " << rank;
      EXPECT_TRUE(torch::equal(net->unused->weight.grad(), torch::full({3, 3}, 0.5)));
      EXPECT_TRUE(torch::equal(net->unused->bias.grad(), torch::full({3}, 0.5)));
    }
  });
  std::vector<Net> idle{make_net(1, 5, true), make_net(1, 5, true)};
  run_ranks(2, [&](int rank, ProcessGroup& pg) {
    DistributedDataParallel ddp(idle[rank],
                                std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}), options);
    for (int s = 0; s < steps; ++s) {
      torch::mse_loss(ddp(torch::ones({2, 6})), torch::zeros({2, 3})).backward();
    }
    EXPECT_FALSE(idle[rank]->unused->weight.grad().defined());
    EXPECT_TRUE(idle[rank]->fc1->weight.grad().defined());
    // A stale .grad of a parameter no rank used is left as it is (PyTorch's default).
    idle[rank]->unused->weight.mutable_grad() = torch::full({3, 3}, 7.0 + rank);
    torch::mse_loss(ddp(torch::ones({2, 6})), torch::zeros({2, 3})).backward();
    EXPECT_TRUE(torch::equal(idle[rank]->unused->weight.grad(), torch::full({3, 3}, 7.0 + rank)));
  });
}

TEST(DataParallel, FindUnusedParametersReducesZerosForThem) {
  DdpOptions o;
  o.find_unused_parameters = true;
  run_find_unused(o, 3);
  o.shared_memory = false;
  o.gradient_as_bucket_view = false;
  run_find_unused(o, 2);
}

TEST(DataParallel, StaticGraphLearnsTheUnusedSetOnce) {
  DdpOptions o;
  o.static_graph = true;
  run_find_unused(o, 4);
}

TEST(DataParallel, BucketsAreRebuiltOnceInRankZerosReadyOrder) {
  std::vector<Net> nets{make_net(1), make_net(1)};
  std::vector<std::vector<BucketInfo>> layouts(2);
  std::vector<std::vector<size_t>> orders(2);
  run_ranks(2, [&](int rank, ProcessGroup& pg) {
    DdpOptions o;
    o.first_bucket_cap_bytes = 64;
    o.bucket_cap_bytes = 128;
    DistributedDataParallel ddp(nets[rank],
                                std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}), o);
    // (tests/sdk/test_ddp_equivalence.py has ranks whose ready orders differ.)
    auto x = torch::ones({2, 6});
    torch::mse_loss(ddp(x), torch::zeros({2, 3})).backward();
    EXPECT_FALSE(ddp.buckets_rebuilt());
    orders[rank] = ddp.grad_ready_order();
    torch::mse_loss(ddp(x), torch::zeros({2, 3})).backward();
    EXPECT_TRUE(ddp.buckets_rebuilt());
    layouts[rank] = ddp.buckets();
  });
  ASSERT_EQ(orders[0].size(), 4u);
  std::vector<size_t> flat;
  for (const auto& b : layouts[0])
    flat.insert(flat.end(), b.parameters.begin(), b.parameters.end());
  EXPECT_EQ(flat, orders[0]);
  ASSERT_EQ(layouts[0].size(), layouts[1].size());
  for (size_t b = 0; b < layouts[0].size(); ++b) {
    EXPECT_EQ(layouts[0][b].parameters, layouts[1][b].parameters);
  }
}

// Tensor::set_ (what LibTorch's Module::load does to each parameter) drops the gradient
// accumulator DDP's hook sat on. The next forward through the wrapper re-attaches the hook, so
// the gradients keep being averaged.
TEST(DataParallel, ParameterGivenNewStorageAfterWrappingIsStillAveraged) {
  run_ranks(2, [&](int rank, ProcessGroup& pg) {
    Net net = make_net(1);
    DistributedDataParallel ddp(net, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
    {
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.set_(p.detach().clone());
    }
    torch::manual_seed(10 + rank);  // different data on each rank
    for (int step = 0; step < 2; ++step) {
      for (auto& p : net->parameters()) p.mutable_grad().reset();
      torch::mse_loss(ddp(torch::randn({4, 6})), torch::randn({4, 3})).backward();
      for (const auto& g : grads_of(net)) {
        auto other = g.clone();
        pg.broadcast(other, 0);
        EXPECT_TRUE(torch::equal(g, other)) << "rank " << rank << " step " << step;
      }
    }
  });
}

TEST(DataParallel, ParameterReplacedByAnotherShapeIsRefusedByName) {
  auto errors = errors_of_ranks(2, [&](int, ProcessGroup& pg) {
    Net net = make_net(1);
    DistributedDataParallel ddp(net, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
    {
      torch::NoGradGuard no_grad;
      net->fc2->weight.set_(torch::zeros({3, 7}));
    }
    ddp(torch::randn({4, 6}));
  });
  for (const auto& e : errors) {
    EXPECT_THAT(e, HasSubstr("parameter 2 (fc2.weight) was replaced after wrapping by a tensor "
                             "of Float [3, 7] on cpu (it was Float [3, 5] on cpu)"));
  }
}

// A backward whose forward bypassed the wrapper cannot be re-attached in time: it must fail,
// naming the parameter, and never count the parameter as unused.
TEST(DataParallel, ReplacedParameterInABackwardOutsideTheWrapperIsAnError) {
  for (bool find_unused : {false, true}) {
    DdpOptions options;
    options.find_unused_parameters = find_unused;
    auto errors = errors_of_ranks(2, [&](int, ProcessGroup& pg) {
      Net net = make_net(1);
      DistributedDataParallel ddp(net, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}),
                                  options);
      {
        torch::NoGradGuard no_grad;
        net->fc1->weight.set_(net->fc1->weight.detach().clone());
      }
      torch::mse_loss(net->forward(torch::randn({4, 6})), torch::randn({4, 3})).backward();
    });
    for (const auto& e : errors) {
      EXPECT_THAT(e, HasSubstr("parameters were given new storage after wrapping"));
      EXPECT_THAT(e, HasSubstr("fc1.weight"));
    }
  }
}

}  // namespace
}  // namespace ddprun
