#include "ddprun/zero_optimizer.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <string>

#include "ddprun/checkpoint.hpp"
#include "test_ranks.hpp"

namespace ddprun {
namespace {

namespace fs = std::filesystem;
using testing::run_ranks;
using Factory = ZeroRedundancyOptimizer::OptimizerFactory;

// Parameters from a formula (every rank builds the same ones; threads share no RNG).
std::vector<torch::Tensor> make_params(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<torch::Tensor> params;
  for (size_t k = 0; k < shapes.size(); ++k) {
    auto t = torch::arange(c10::multiply_integers(shapes[k])).to(torch::kFloat);
    params.push_back(
        (torch::sin(t * 0.7 + static_cast<double>(k)) * 0.3).reshape(shapes[k]).requires_grad_());
  }
  return params;
}

const std::vector<std::vector<int64_t>> kShapes = {{8, 6}, {8}, {4, 8}, {4}, {5, 5}, {3}, {16}};

// Gradients for step `step`, the same on every rank (as after DDP's all-reduce). Parameter 5
// gets none on odd steps: the optimizers skip it then.
void set_grads(std::vector<torch::Tensor>& params, int step) {
  for (size_t k = 0; k < params.size(); ++k) {
    auto& p = params[k];
    if (k == 5 && step % 2 == 1) {
      p.mutable_grad().reset();
      continue;
    }
    auto t = torch::arange(p.numel()).to(torch::kFloat).reshape(p.sizes());
    p.mutable_grad() = torch::cos(t * 0.31 + static_cast<double>(step * 3 + k));
  }
}

Factory sgd_momentum() {
  return [](std::vector<torch::Tensor> shard) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(shard, torch::optim::SGDOptions(0.1).momentum(0.9));
  };
}

Factory adam() {
  return [](std::vector<torch::Tensor> shard) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(0.01));
  };
}

// N steps of ZeRO on every rank and of the unsharded optimizer (same factory): the same
// parameters, bit for bit (each parameter's update is the same kernel on the same numbers).
void expect_same_as_unsharded(int world, const Factory& factory, ZeroOptions options = {}) {
  constexpr int kSteps = 5;
  auto ref = make_params(kShapes);
  auto plain = factory(ref);
  for (int step = 0; step < kSteps; ++step) {
    set_grads(ref, step);
    plain->step();
  }
  const int64_t unsharded_bytes = optimizer_state_bytes(*plain);
  run_ranks(world, [&](int rank, ProcessGroup& pg) {
    auto params = make_params(kShapes);
    std::shared_ptr<ProcessGroup> group(&pg, [](ProcessGroup*) {});
    ZeroRedundancyOptimizer zero(params, group, factory, options);
    for (int step = 0; step < kSteps; ++step) {
      zero.zero_grad();
      set_grads(params, step);
      zero.step();
    }
    for (size_t k = 0; k < params.size(); ++k) {
      EXPECT_TRUE(torch::equal(params[k], ref[k])) << "rank " << rank << " parameter " << k;
    }
    // The state is split, not copied: the ranks' bytes add up to the unsharded optimizer's.
    auto bytes = torch::tensor({zero.local_state_bytes()});
    EXPECT_LT(bytes.item<int64_t>(), unsharded_bytes);
    pg.all_reduce(bytes);
    EXPECT_EQ(bytes.item<int64_t>(), unsharded_bytes);
  });
}

TEST(ZeroOptimizer, SgdMomentumMatchesUnsharded) {
  expect_same_as_unsharded(2, sgd_momentum());
  expect_same_as_unsharded(3, sgd_momentum());
}

TEST(ZeroOptimizer, AdamMatchesUnsharded) {
  expect_same_as_unsharded(2, adam());
  expect_same_as_unsharded(3, adam());
}

TEST(ZeroOptimizer, ParametersAsBucketViewMatchesUnsharded) {
  expect_same_as_unsharded(2, adam(), ZeroOptions{true});
  expect_same_as_unsharded(3, sgd_momentum(), ZeroOptions{true});
}

TEST(ZeroOptimizer, PartitionIsPyTorchs) {
  // Worked by hand: sorted by size (ties keep index order): 5(40) 0(30) 3(30) 1(10) 4(10) 2(5)
  // 6(5); each to the least loaded rank, the lowest on a tie.
  //   5 -> r0 {40,0,0}; 0 -> r1 {40,30,0}; 3 -> r2 {40,30,30}; 1 -> r1 {40,40,30};
  //   4 -> r2 {40,40,40}; 2 -> r0 {45,40,40}; 6 -> r1 {45,45,40}.
  auto p = partition_parameters({30, 10, 5, 30, 10, 40, 5}, 3);
  EXPECT_EQ(p, (std::vector<std::vector<size_t>>{{5, 2}, {0, 1, 6}, {3, 4}}));
  // Two ranks: 5 -> r0 (40); 0 -> r1 (30); 3 -> r1 (60); 1 -> r0 (50); 4 -> r0 (60);
  // 2 -> r0 (65, tie at 60 goes to r0); 6 -> r1 (65).
  p = partition_parameters({30, 10, 5, 30, 10, 40, 5}, 2);
  EXPECT_EQ(p, (std::vector<std::vector<size_t>>{{5, 1, 4, 2}, {0, 3, 6}}));
  // More ranks than parameters: the last rank owns nothing.
  p = partition_parameters({3, 3}, 3);
  EXPECT_EQ(p, (std::vector<std::vector<size_t>>{{0}, {1}, {}}));
}

TEST(ZeroOptimizer, OwnersFollowThePartitionAndEmptyShardsWork) {
  run_ranks(3, [&](int rank, ProcessGroup& pg) {
    auto params = make_params({{4}, {2, 3}});
    std::shared_ptr<ProcessGroup> group(&pg, [](ProcessGroup*) {});
    auto zero = make_zero<torch::optim::Adam>(params, group, torch::optim::AdamOptions(0.1));
    EXPECT_EQ(zero.owners(), (std::vector<int>{1, 0}));
    EXPECT_EQ(zero.local_optimizer().param_groups()[0].params().size(), rank == 2 ? 0u : 1u);
    auto before = params[0].detach().clone();
    for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
    zero.step();
    EXPECT_FALSE(torch::equal(before, params[0]));  // rank 1's update reached every rank
    EXPECT_EQ(zero.local_state_bytes(), rank == 2 ? 0 : 2 * 4 * (rank == 0 ? 6 : 4));
  });
}

TEST(ZeroOptimizer, ZeroGradAndSchedulerLearningRate) {
  run_ranks(2, [&](int, ProcessGroup& pg) {
    auto params = make_params({{3}, {3}});
    std::shared_ptr<ProcessGroup> group(&pg, [](ProcessGroup*) {});
    auto zero = make_zero<torch::optim::SGD>(params, group, torch::optim::SGDOptions(1.0));
    for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
    zero.zero_grad(false);
    for (auto& p : params) EXPECT_TRUE(torch::equal(p.grad(), torch::zeros_like(p)));
    zero.zero_grad(true);
    for (auto& p : params) EXPECT_FALSE(p.grad().defined());
    // A scheduler halves the learning rate on ZeRO's group; the local optimizers follow.
    torch::optim::StepLR scheduler(zero, 1, 0.5);
    scheduler.step();  // LibTorch's first step() keeps the rate, the second halves it
    scheduler.step();
    ASSERT_EQ(zero.param_groups()[0].options().get_lr(), 0.5);
    auto before = params[1].detach().clone();
    for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
    zero.step();
    EXPECT_TRUE(torch::allclose(params[1], before - 0.5));
  });
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ddprun_zero_XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

// A module holding `params` as p0, p1, ... (what a checkpoint saves them under).
std::shared_ptr<torch::nn::Module> module(std::vector<torch::Tensor> params) {
  auto m = std::make_shared<torch::nn::Module>();
  for (size_t k = 0; k < params.size(); ++k) {
    std::string name = std::to_string(k);
    name.insert(name.begin(), 'p');  // not "p" + string: GCC 12 warns on it (a false positive)
    m->register_parameter(name, params[k]);
  }
  return m;
}

// The unsharded reference: 3 steps, a checkpoint at `path`, 2 more steps.
void run_reference(std::vector<torch::Tensor>& ref, torch::optim::Optimizer& plain,
                   const std::string& path) {
  for (int step = 0; step < 3; ++step) {
    set_grads(ref, step);
    plain.step();
  }
  save_checkpoint(path, {0, 3, {}}, *module(ref), plain);
  for (int step = 3; step < 5; ++step) {
    set_grads(ref, step);
    plain.step();
  }
}

TEST(ZeroOptimizer, CheckpointRoundTripAndPlainOptimizerInterop) {
  TempDir dir;
  const std::string path = (dir.path / "ckpt.pt").string();
  // Unsharded reference: 3 steps, save, 2 more steps.
  auto ref = make_params(kShapes);
  auto plain = adam()(ref);
  const std::string plain_path = (dir.path / "plain.pt").string();
  run_reference(ref, *plain, plain_path);
  run_ranks(2, [&](int rank, ProcessGroup& pg) {
    std::shared_ptr<ProcessGroup> group(&pg, [](ProcessGroup*) {});
    auto params = make_params(kShapes);
    ZeroRedundancyOptimizer zero(params, group, adam());
    for (int step = 0; step < 3; ++step) {
      set_grads(params, step);
      zero.step();
    }
    zero.consolidate_state_dict(0);
    if (rank == 1) {
      torch::serialize::OutputArchive unused;
      EXPECT_THROW(zero.save(unused), Error);  // consolidated on rank 0 only
    }
    if (rank == 0) save_checkpoint(path, {0, 3, {}}, *module(params), zero);
    pg.barrier();
    // A fresh model and optimizer resume from the ZeRO checkpoint, another from the plain
    // optimizer's: both continue exactly as the unsharded optimizer did.
    for (const auto& from : {path, plain_path}) {
      auto fresh = make_params(kShapes);
      ZeroRedundancyOptimizer resumed(fresh, group, adam());
      auto got = load_checkpoint(pg, from, *module(fresh), resumed);
      ASSERT_TRUE(got.has_value());
      EXPECT_EQ(resumed.local_state_bytes(), zero.local_state_bytes());
      for (int step = 3; step < 5; ++step) {
        set_grads(fresh, step);
        resumed.step();
      }
      for (size_t k = 0; k < fresh.size(); ++k) {
        EXPECT_TRUE(torch::equal(fresh[k], ref[k])) << from << " parameter " << k;
      }
    }
  });
  // The ZeRO checkpoint loads into a plain optimizer too, which then continues the same way.
  run_ranks(1, [&](int, ProcessGroup& pg) {
    auto loaded = make_params(kShapes);
    auto plain_loaded = adam()(loaded);
    ASSERT_TRUE(load_checkpoint(pg, path, *module(loaded), *plain_loaded).has_value());
    EXPECT_EQ(optimizer_state_bytes(*plain_loaded), optimizer_state_bytes(*plain));
    for (int step = 3; step < 5; ++step) {
      set_grads(loaded, step);
      plain_loaded->step();
    }
    for (size_t k = 0; k < loaded.size(); ++k) EXPECT_TRUE(torch::equal(loaded[k], ref[k])) << k;
  });
}

}  // namespace
}  // namespace ddprun
