#include "ddprun/data_parallel.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "ddp_test_net.hpp"
#include "test_ranks.hpp"

namespace ddprun {
namespace {

using testing::errors_of_ranks;
using ::testing::HasSubstr;
using testing::run_ranks;
using testing::dp::grads_of;
using testing::dp::make_net;
using testing::dp::Net;

void expect_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                  double rtol, double atol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], rtol, atol)) << "tensor " << i << "\n"
                                                         << a[i] << "\nvs\n"
                                                         << b[i];
  }
}

// Reference: one process on the whole batch. DDP on `world` ranks, each on its slice, must give
// the same gradients every step (averaged loss), and so the same parameters.
void check_equivalence(const DdpOptions& options, double rtol, double atol, int world = 2,
                       const std::string& transport = "") {
  const int steps = 4;
  torch::manual_seed(100);
  auto x = torch::randn({4 * world, 6});
  auto y = torch::randn({4 * world, 3});
  Net ref = make_net(1);
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<std::vector<torch::Tensor>> ref_grads;
  for (int s = 0; s < steps; ++s) {
    ref_opt.zero_grad();
    torch::mse_loss(ref->forward(x), y).backward();
    ref_grads.push_back(grads_of(ref));
    ref_opt.step();
  }
  std::vector<Net> nets{make_net(1)};
  for (int r = 1; r < world; ++r) nets.push_back(make_net(r + 1));  // DDP broadcasts rank 0's
  run_ranks(world, [&](int rank, ProcessGroup& pg) {
    Net net = nets[rank];
    DistributedDataParallel ddp(net, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}),
                                options);
    if (!transport.empty()) {
      EXPECT_EQ(ddp.transport(), transport);
    }
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto xs = x.chunk(world)[rank], ys = y.chunk(world)[rank];
    for (int s = 0; s < steps; ++s) {
      // Cover the ways gradients get cleared: the optimizer's zero_grad() (in place with
      // detach_() in 1.13, set-to-none in 2.x), set-to-none and zero_() by hand.
      if (s % 3 == 0) {
        opt.zero_grad();
      } else {
        for (auto& p : net->parameters()) {
          if (!p.grad().defined()) continue;
          if (s % 3 == 1) {
            p.mutable_grad().reset();
          } else {
            p.mutable_grad().zero_();
          }
        }
      }
      torch::mse_loss(ddp(xs), ys).backward();
      expect_close(grads_of(net), ref_grads[s], rtol, atol);
      opt.step();
    }
    std::vector<torch::Tensor> params, ref_params;
    for (auto& p : net->parameters()) params.push_back(p.detach());
    for (auto& p : ref->parameters()) ref_params.push_back(p.detach());
    expect_close(params, ref_params, rtol, atol);
  });
}

TEST(DataParallel, MatchesOneProcessOnTheWholeBatch) {
  check_equivalence(DdpOptions{}, 1e-5, 1e-6, 2, "shared memory");  // ranks share this host
  check_equivalence(DdpOptions{}, 1e-5, 1e-6, 3, "shared memory");
  DdpOptions gloo;
  gloo.shared_memory = false;
  check_equivalence(gloo, 1e-5, 1e-6, 2, "gloo");
  check_equivalence(gloo, 1e-5, 1e-6, 3, "gloo");
}

TEST(DataParallel, MatchesWithManyBucketsAndCopies) {
  for (bool shm : {true, false}) {
    DdpOptions small;
    small.shared_memory = shm;
    small.first_bucket_cap_bytes = 64;
    small.bucket_cap_bytes = 128;
    check_equivalence(small, 1e-5, 1e-6);
    small.gradient_as_bucket_view = false;
    check_equivalence(small, 1e-5, 1e-6);
  }
}

TEST(DataParallel, SharedMemoryCanBeTurnedOff) {
  ::setenv("DDPRUN_SHM", "0", 1);
  check_equivalence(DdpOptions{}, 1e-5, 1e-6, 2, "gloo");
  ::unsetenv("DDPRUN_SHM");
}

TEST(DataParallel, CompressedGradientsAreClose) {
  DdpOptions fp16;
  fp16.compression = GradCompression::kFp16;
  check_equivalence(fp16, 1e-2, 1e-3);
  DdpOptions bf16;
  bf16.compression = GradCompression::kBf16;
#if TORCH_VERSION_MAJOR >= 2
  check_equivalence(bf16, 3e-2, 1e-2);
#else
  EXPECT_THROW(check_equivalence(bf16, 3e-2, 1e-2), Error);  // 1.13's Gloo has no bfloat16
#endif
}

TEST(DataParallel, BucketLayoutIsReverseOrderWithSmallFirstBucket) {
  // fc1.weight 120 B, fc1.bias 20 B, fc2.weight 60 B, fc2.bias 12 B.
  Net net = make_net(1);
  run_ranks(1, [&](int, ProcessGroup& pg) {
    DdpOptions o;
    o.first_bucket_cap_bytes = 64;
    o.bucket_cap_bytes = 128;
    DataParallel ddp(net.ptr(), std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}), o);
    auto buckets = ddp.buckets();
    ASSERT_EQ(buckets.size(), 2u);
    EXPECT_EQ(buckets[0].parameters, (std::vector<size_t>{3, 2}));
    EXPECT_EQ(buckets[0].bytes, 72);
    EXPECT_EQ(buckets[1].parameters, (std::vector<size_t>{1, 0}));
    DataParallel one(net.ptr(), std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
    ASSERT_EQ(one.buckets().size(), 1u);
    EXPECT_EQ(one.buckets()[0].parameters, (std::vector<size_t>{3, 2, 1, 0}));
  });
}

TEST(DataParallel, NoSyncAccumulatesLocallyThenReducesTheSum) {
  torch::manual_seed(5);
  auto xa = torch::randn({8, 6}), ya = torch::randn({8, 3});
  auto xb = torch::randn({8, 6}), yb = torch::randn({8, 3});
  Net ref = make_net(3);
  torch::mse_loss(ref->forward(xa), ya).backward();
  torch::mse_loss(ref->forward(xb), yb).backward();
  auto expected = grads_of(ref);
  std::vector<Net> nets{make_net(3), make_net(3)};
  run_ranks(2, [&](int rank, ProcessGroup& pg) {
    Net net = nets[rank];
    DistributedDataParallel ddp(net, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
    {
      auto guard = ddp.no_sync();
      torch::mse_loss(ddp(xa.chunk(2)[rank]), ya.chunk(2)[rank]).backward();
    }
    // Not reduced: each rank holds its own local gradient.
    auto local = net->parameters()[0].grad().clone();
    auto others = pg.all_gather(local);
    EXPECT_FALSE(torch::allclose(others[0], others[1]));
    torch::mse_loss(ddp(xb.chunk(2)[rank]), yb.chunk(2)[rank]).backward();
    expect_close(grads_of(net), expected, 1e-5, 1e-6);
  });
}

TEST(DataParallel, UnusedParameterIsAClearError) {
  std::vector<Net> nets{make_net(1, 5, true), make_net(1, 5, true)};
  auto errors = errors_of_ranks(2, [&](int rank, ProcessGroup& pg) {
    DistributedDataParallel ddp(nets[rank],
                                std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
    torch::mse_loss(ddp(torch::ones({2, 6})), torch::zeros({2, 3})).backward();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(errors[r],
                HasSubstr("rank " + std::to_string(r) + "): parameters got no gradient"));
    EXPECT_THAT(errors[r], HasSubstr("unused.weight"));
    EXPECT_THAT(errors[r], HasSubstr("unused.bias"));
    EXPECT_THAT(errors[r], ::testing::Not(HasSubstr("fc1.weight")));
  }
}

// Raises in backward. Applied to the input, so it runs after the model's gradient hooks.
struct Boom : torch::autograd::Function<Boom> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list) {
    throw std::runtime_error("boom");
  }
};

TEST(DataParallel, AnInterruptedBackwardIsReportedAtTheNextForward) {
  Net net = make_net(1);
  run_ranks(1, [&](int, ProcessGroup& pg) {
    DistributedDataParallel ddp(net, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
    auto x = torch::ones({2, 6}, torch::requires_grad());
    auto loss = torch::mse_loss(ddp(Boom::apply(x)), torch::zeros({2, 3}));
    EXPECT_THROW(loss.backward(), std::exception);
    try {
      ddp(torch::ones({2, 6}));
      ADD_FAILURE() << "no error at the forward after a failed backward";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("did not finish reducing gradients"));
    }
    // The wrapper is usable again.
    torch::mse_loss(ddp(torch::ones({2, 6})), torch::zeros({2, 3})).backward();
  });
}

TEST(DataParallel, DifferentModelsAcrossRanksNameRankAndParameter) {
  std::vector<Net> nets{make_net(1, 5), make_net(1, 7)};
  auto errors = errors_of_ranks(2, [&](int rank, ProcessGroup& pg) {
    DistributedDataParallel ddp(nets[rank],
                                std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
  });
  for (const auto& e : errors) {
    EXPECT_THAT(e, HasSubstr("rank 1 parameter 0 is [fc1.weight Float shape [7, 6]"));
    EXPECT_THAT(e, HasSubstr("rank 0 has [fc1.weight Float shape [5, 6]"));
  }
  std::vector<Net> extra{make_net(1, 5), make_net(1, 5, true)};
  errors = errors_of_ranks(2, [&](int rank, ProcessGroup& pg) {
    DistributedDataParallel ddp(extra[rank],
                                std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
  });
  EXPECT_THAT(errors[0], HasSubstr("rank 1 has 6 parameters but rank 0 has 4"));
}

TEST(DataParallel, BroadcastsBuffersFromRankZero) {
  std::vector<Net> nets{make_net(1), make_net(1)};
  nets[0]->running.fill_(3);
  run_ranks(2, [&](int rank, ProcessGroup& pg) {
    DistributedDataParallel ddp(nets[rank],
                                std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
    EXPECT_TRUE(torch::equal(nets[rank]->running, torch::full({2}, 3.0f)));
    if (rank == 0) nets[0]->running.fill_(9);
    ddp(torch::ones({1, 6}));
    EXPECT_TRUE(torch::equal(nets[rank]->running, torch::full({2}, 9.0f)));
  });
}

TEST(DataParallel, HooksGoAwayWithTheWrapper) {
  Net net = make_net(1);
  run_ranks(1, [&](int, ProcessGroup& pg) {
    {
      DistributedDataParallel ddp(net, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
      torch::mse_loss(ddp(torch::ones({2, 6})), torch::zeros({2, 3})).backward();
    }
    torch::mse_loss(net->forward(torch::ones({2, 6})), torch::zeros({2, 3})).backward();
  });
  EXPECT_TRUE(net->parameters()[0].grad().defined());
}

TEST(DataParallel, RejectsModuleWithoutTrainableParameters) {
  auto frozen = make_net(1);
  for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  run_ranks(1, [&](int, ProcessGroup& pg) {
    EXPECT_THROW(
        DistributedDataParallel(frozen, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {})),
        Error);
  });
}

}  // namespace
}  // namespace ddprun
