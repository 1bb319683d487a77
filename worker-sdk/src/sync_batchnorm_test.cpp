#include "ddprun/sync_batchnorm.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numeric>
#include <string>
#include <vector>

#include "ddprun/process_group.hpp"
#include "test_ranks.hpp"

namespace ddprun {
namespace {

using testing::run_ranks;

std::shared_ptr<ProcessGroup> unowned(ProcessGroup& pg) {
  return std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {});
}

// torch::nn::BatchNorm of the dimensionality an input of `dim` dimensions needs.
torch::nn::AnyModule reference_bn(int64_t dim, const torch::nn::BatchNormOptions& o) {
  if (dim <= 3) return torch::nn::AnyModule(torch::nn::BatchNorm1d(o));
  if (dim == 4) return torch::nn::AnyModule(torch::nn::BatchNorm2d(o));
  return torch::nn::AnyModule(torch::nn::BatchNorm3d(o));
}

at::Tensor param(torch::nn::Module& m, const std::string& name) {
  return m.named_parameters()[name];
}
at::Tensor buffer(torch::nn::Module& m, const std::string& name) {
  return m.named_buffers()[name];
}

// Same affine parameters on both, not the trivial ones, so that weight enters the gradients.
void set_affine(torch::nn::Module& m, int64_t c) {
  torch::NoGradGuard no_grad;
  param(m, "weight").copy_(torch::linspace(0.5, 1.5, c));
  param(m, "bias").copy_(torch::linspace(-0.2, 0.3, c));
}

struct Case {
  std::vector<int64_t> shape;  // of one row: (C, *)
  std::vector<int64_t> rows;   // per rank
  torch::nn::BatchNormOptions options;
  at::ScalarType dtype = at::kFloat;
};

// Two training steps of SyncBatchNorm on each rank's rows against torch::nn::BatchNorm on all
// rows at once: outputs, input gradients, summed weight/bias gradients and running statistics.
void expect_matches_global_batch(const Case& c, double rtol, double atol) {
  const int world = static_cast<int>(c.rows.size());
  const int64_t total = std::accumulate(c.rows.begin(), c.rows.end(), int64_t{0});
  std::vector<int64_t> full{total};
  full.insert(full.end(), c.shape.begin(), c.shape.end());
  const int64_t channels = c.shape[0];
  torch::manual_seed(7);
  std::vector<at::Tensor> xs, gs;
  for (int step = 0; step < 2; ++step) {
    xs.push_back(torch::randn(full, at::TensorOptions(c.dtype)) * (step + 1) + step);
    gs.push_back(torch::randn(full, at::TensorOptions(c.dtype)));
  }
  run_ranks(world, [&](int rank, ProcessGroup& pg) {
    const int64_t offset = std::accumulate(c.rows.begin(), c.rows.begin() + rank, int64_t{0});
    const int64_t dim = static_cast<int64_t>(full.size());
    auto ref = reference_bn(dim, c.options);
    SyncBatchNorm sbn(c.options, unowned(pg));
    ref.ptr()->to(c.dtype);
    sbn->to(c.dtype);
    if (c.options.affine()) {
      set_affine(*ref.ptr(), channels);
      set_affine(*sbn, channels);
    }
    for (size_t step = 0; step < xs.size(); ++step) {
      auto gx = xs[step].clone().requires_grad_();
      auto gy = ref.forward(gx);
      (gy * gs[step]).sum().backward();
      auto x = xs[step].narrow(0, offset, c.rows[rank]).clone().requires_grad_();
      auto y = sbn(x);
      (y * gs[step].narrow(0, offset, c.rows[rank])).sum().backward();

      EXPECT_EQ(y.sizes(), x.sizes());
      EXPECT_EQ(y.scalar_type(), c.dtype);
      EXPECT_TRUE(torch::allclose(y, gy.narrow(0, offset, c.rows[rank]), rtol, atol))
          << "rank " << rank << " step " << step;
      EXPECT_TRUE(torch::allclose(x.grad(), gx.grad().narrow(0, offset, c.rows[rank]), rtol, atol))
          << "rank " << rank << " step " << step << "\n"
          << x.grad() << gx.grad();
      if (c.options.affine()) {
        // Local sums; DDP would average them, so their sum is BatchNorm's gradient.
        for (const char* name : {"weight", "bias"}) {
          auto g = param(*sbn, name).grad().clone();
          ASSERT_TRUE(g.defined()) << name;
          pg.all_reduce(g);
          EXPECT_TRUE(torch::allclose(g, param(*ref.ptr(), name).grad(), rtol, atol))
              << name << " rank " << rank << " step " << step;
          param(*sbn, name).grad().zero_();
          param(*ref.ptr(), name).grad().zero_();
        }
      }
      if (c.options.track_running_stats()) {
        EXPECT_TRUE(
            torch::allclose(sbn->running_mean, buffer(*ref.ptr(), "running_mean"), rtol, atol));
        EXPECT_TRUE(
            torch::allclose(sbn->running_var, buffer(*ref.ptr(), "running_var"), rtol, atol));
        EXPECT_EQ(sbn->num_batches_tracked.item<int64_t>(), static_cast<int64_t>(step + 1));
      }
    }
  });
}

// float32 against a float32 BatchNorm: the two sum in different orders (per rank, then across
// ranks, in double for the statistics), a few ulps on values of order 1.
constexpr double kRtol = 1e-5, kAtol = 1e-5;

TEST(SyncBatchNorm, MatchesBatchNorm1dOnTheGlobalBatch) {
  expect_matches_global_batch({{5}, {3, 6, 2}, torch::nn::BatchNormOptions(5)}, kRtol, kAtol);
  expect_matches_global_batch({{4, 7}, {2, 3}, torch::nn::BatchNormOptions(4)}, kRtol, kAtol);
}

TEST(SyncBatchNorm, MatchesBatchNorm2dOnTheGlobalBatch) {
  expect_matches_global_batch({{3, 4, 5}, {2, 1, 4}, torch::nn::BatchNormOptions(3)}, kRtol, kAtol);
}

TEST(SyncBatchNorm, MatchesBatchNorm3dOnTheGlobalBatch) {
  expect_matches_global_batch({{2, 3, 2, 4}, {1, 3}, torch::nn::BatchNormOptions(2)}, kRtol, kAtol);
}

TEST(SyncBatchNorm, DoubleMatchesToRounding) {
  // In double the only differences are summation order: 1e-12 catches any formula slip.
  expect_matches_global_batch({{3, 5}, {4, 2, 3}, torch::nn::BatchNormOptions(3), at::kDouble},
                              1e-12, 1e-12);
}

TEST(SyncBatchNorm, CumulativeAverageAndOptions) {
  // momentum unset: running stats are the cumulative average, as BatchNorm's.
  expect_matches_global_batch(
      {{3, 4}, {2, 5}, torch::nn::BatchNormOptions(3).momentum(c10::nullopt)}, kRtol, kAtol);
  expect_matches_global_batch(
      {{3, 4}, {3, 2}, torch::nn::BatchNormOptions(3).affine(false).momentum(0.3).eps(1e-3)}, kRtol,
      kAtol);
  expect_matches_global_batch(
      {{3, 4}, {3, 2}, torch::nn::BatchNormOptions(3).track_running_stats(false)}, kRtol, kAtol);
}

TEST(SyncBatchNorm, RankWithNoRows) {
  // As PyTorch's: a rank with an empty batch still takes part in both collectives.
  expect_matches_global_batch({{3, 4}, {4, 0, 3}, torch::nn::BatchNormOptions(3)}, kRtol, kAtol);
  expect_matches_global_batch({{2}, {0, 5}, torch::nn::BatchNormOptions(2)}, kRtol, kAtol);
}

TEST(SyncBatchNorm, OneValuePerChannelOverAllRanksIsAnError) {
  auto errors = testing::errors_of_ranks(2, [](int rank, ProcessGroup& pg) {
    SyncBatchNorm sbn(torch::nn::BatchNormOptions(3), unowned(pg));
    sbn(torch::randn({rank == 0 ? 1 : 0, 3}));
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("more than 1 value per channel"), std::string::npos) << e;
}

TEST(SyncBatchNorm, EvalModeAndOneRankAreBatchNorm) {
  // Bitwise equal, and without collectives: only rank 0 runs the eval forwards.
  run_ranks(2, [](int rank, ProcessGroup& pg) {
    auto x = torch::sin(torch::arange(72, torch::kFloat).reshape({6, 4, 3}) * 0.7) * 2 + 1;
    SyncBatchNorm sbn(torch::nn::BatchNormOptions(4), unowned(pg));
    torch::nn::BatchNorm1d bn(4);
    set_affine(*sbn, 4);
    set_affine(*bn, 4);
    sbn(x * (rank + 1));  // global statistics into the running buffers
    {
      torch::NoGradGuard no_grad;
      bn->running_mean.copy_(sbn->running_mean);
      bn->running_var.copy_(sbn->running_var);
    }
    sbn->eval();
    bn->eval();
    if (rank == 0) {
      EXPECT_TRUE(torch::equal(sbn(x), bn(x)));
      auto free_stats = torch::nn::BatchNormOptions(4).track_running_stats(false);
      SyncBatchNorm s2(free_stats, unowned(pg));
      torch::nn::BatchNorm1d b2(free_stats);
      s2->eval();
      b2->eval();
      EXPECT_TRUE(torch::equal(s2(x), b2(x)));  // batch statistics, this rank's only
    }
    pg.barrier();
  });
  run_ranks(1, [](int, ProcessGroup& pg) {
    torch::manual_seed(4);
    auto x = torch::randn({5, 3, 2, 2});
    SyncBatchNorm sbn(torch::nn::BatchNormOptions(3).momentum(c10::nullopt), unowned(pg));
    torch::nn::BatchNorm2d bn(torch::nn::BatchNormOptions(3).momentum(c10::nullopt));
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(torch::equal(sbn(x * i), bn(x * i)));
    EXPECT_TRUE(torch::equal(sbn->running_var, bn->running_var));
  });
}

TEST(SyncBatchNorm, SameNamesAsBatchNormAndClones) {
  run_ranks(1, [](int, ProcessGroup& pg) {
    SyncBatchNorm sbn(torch::nn::BatchNormOptions(3), unowned(pg));
    torch::nn::BatchNorm2d bn(3);
    EXPECT_EQ(sbn->named_parameters().keys(), bn->named_parameters().keys());
    EXPECT_EQ(sbn->named_buffers().keys(), bn->named_buffers().keys());
    auto copy = std::dynamic_pointer_cast<SyncBatchNormImpl>(sbn->clone());
    ASSERT_TRUE(copy);
    EXPECT_EQ(copy->process_group(), sbn->process_group());
    EXPECT_FALSE(copy->weight.is_same(sbn->weight));
    std::ostringstream s;
    s << *sbn;
    EXPECT_EQ(s.str(),
              "ddprun::SyncBatchNorm(3, eps=1e-05, momentum=0.1, affine=true, "
              "track_running_stats=true)");
  });
}

// Rows that differ per rank, so global statistics differ from local ones.
at::Tensor rank_rows(int rank, int64_t n, int64_t features) {
  return torch::sin(torch::arange(n * features, torch::kFloat).reshape({n, features}) * 0.3 +
                    rank * 2.0) *
             (rank + 1) +
         rank;
}

TEST(SyncBatchNorm, ConvertInSequentialRunsSyncBatchNorm) {
  run_ranks(2, [](int rank, ProcessGroup& pg) {
    auto net = torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4),
                                     torch::nn::ReLU());
    {
      // Not from the random generator, which the rank threads share: same weights on both.
      torch::NoGradGuard no_grad;
      auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(net->ptr(0));
      linear->weight.copy_(torch::cos(torch::arange(12, torch::kFloat)).reshape({4, 3}));
      linear->bias.copy_(torch::linspace(-0.3, 0.2, 4));
    }
    auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(net->ptr(1));
    bn->bias.set_requires_grad(false);
    auto weight = bn->weight, bias = bn->bias, mean = bn->running_mean;
    auto before = net->named_parameters().keys();

    // What BatchNorm over both ranks' rows gives: the reference.
    auto ref = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone());
    auto x = rank_rows(rank, 4, 3);
    auto all = torch::cat({rank_rows(0, 4, 3), rank_rows(1, 4, 3)});
    auto expected = ref->forward(all).narrow(0, rank * 4, 4);

    EXPECT_EQ(convert_sync_batchnorm(*net, unowned(pg)), std::vector<std::string>{"1"});
    auto sync =
        std::dynamic_pointer_cast<SyncBatchNormImpl>(net->ptr(1));  // the list forward() runs
    ASSERT_TRUE(sync);
    EXPECT_EQ(std::dynamic_pointer_cast<SyncBatchNormImpl>(net->named_children()["1"]), sync);
    EXPECT_TRUE(sync->weight.is_same(weight));  // shared, as Python's convert_sync_batchnorm
    EXPECT_TRUE(sync->bias.is_same(bias));
    EXPECT_TRUE(sync->running_mean.is_same(mean));
    EXPECT_FALSE(sync->bias.requires_grad());
    EXPECT_EQ(net->named_parameters().keys(), before);

    auto y = net->forward(x);
    EXPECT_TRUE(torch::allclose(y, expected, kRtol, kAtol)) << y << expected;
    EXPECT_TRUE(torch::allclose(
        mean, std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(ref->ptr(1))->running_mean,
        kRtol, kAtol));
  });
}

TEST(SyncBatchNorm, ConvertInModuleListAndDictKeepsMode) {
  run_ranks(2, [](int rank, ProcessGroup& pg) {
    struct NetImpl : torch::nn::Module {
      NetImpl() {
        list = register_module(
            "list", torch::nn::ModuleList(torch::nn::Linear(3, 3), torch::nn::BatchNorm1d(3)));
        dict = register_module(
            "dict",
            torch::nn::ModuleDict(std::vector<std::pair<std::string, std::shared_ptr<Module>>>{
                {"norm", torch::nn::BatchNorm1d(3).ptr()}}));
      }
      torch::nn::ModuleList list{nullptr};
      torch::nn::ModuleDict dict{nullptr};
    };
    auto net = std::make_shared<NetImpl>();
    net->dict["norm"]->eval();
    auto paths = convert_sync_batchnorm(*net, unowned(pg));
    EXPECT_EQ(paths, (std::vector<std::string>{"list.1", "dict.norm"}));
    // Elements are reached through the containers' own lists: those hold the new layer.
    EXPECT_TRUE(net->list[1]->as<SyncBatchNormImpl>());
    EXPECT_FALSE(net->list[1]->as<torch::nn::BatchNorm1dImpl>());
    auto norm = net->dict["norm"]->as<SyncBatchNormImpl>();
    ASSERT_TRUE(norm);
    EXPECT_FALSE(norm->is_training());
    EXPECT_TRUE(net->list[1]->is_training());
    EXPECT_EQ(net->named_modules()["dict.norm"].get(), norm);

    auto x = rank_rows(rank, 3, 3);
    auto all = torch::cat({rank_rows(0, 3, 3), rank_rows(1, 3, 3)});
    auto expected = torch::nn::BatchNorm1d(3)(all).narrow(0, rank * 3, 3);
    auto y = net->list[1]->as<SyncBatchNormImpl>()->forward(x);
    EXPECT_TRUE(torch::allclose(y, expected, kRtol, kAtol));
  });
}

TEST(SyncBatchNorm, ConvertRefusesATypedMemberAndChangesNothing) {
  struct BlockImpl : torch::nn::Module {
    BlockImpl() {
      conv = register_module("conv", torch::nn::Conv2d(3, 4, 1));
      bn = register_module("bn", torch::nn::BatchNorm2d(4));
    }
    at::Tensor forward(const at::Tensor& x) { return bn(conv(x)); }
    torch::nn::Conv2d conv{nullptr};
    torch::nn::BatchNorm2d bn{nullptr};  // called directly: cannot be swapped from outside
  };
  run_ranks(1, [](int, ProcessGroup& pg) {
    torch::nn::Sequential net;
    net->push_back(torch::nn::BatchNorm2d(3));
    net->push_back(std::make_shared<BlockImpl>());
    try {
      convert_sync_batchnorm(*net, unowned(pg));
      ADD_FAILURE() << "expected ddprun::Error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("1.bn"), std::string::npos) << what;
      EXPECT_NE(what.find("declare that member as ddprun::SyncBatchNorm"), std::string::npos);
    }
    EXPECT_TRUE(
        std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(net->ptr(0)));  // nothing converted
    EXPECT_THROW(convert_sync_batchnorm(*torch::nn::BatchNorm2d(3), unowned(pg)), Error);
    // A BatchNorm taken over directly instead.
    torch::nn::BatchNorm2d bn(3);
    SyncBatchNorm sbn(*bn, unowned(pg));
    EXPECT_TRUE(sbn->running_var.is_same(bn->running_var));
    EXPECT_THROW(SyncBatchNorm(*torch::nn::Linear(2, 2), unowned(pg)), Error);
  });
}

}  // namespace
}  // namespace ddprun
