// PowerSGD as a DDP communication hook: options validated, exact recovery of low-rank
// averages, error feedback, warm-up iterations, bytes on the wire, training with many buckets.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddprun/comm_hooks.hpp"
#include "ddprun/data_parallel.hpp"
#include "hook_test_util.hpp"

namespace ddprun {
namespace {

using testing::borrow;
using testing::Grads;
using ::testing::HasSubstr;
using testing::make_net;
using testing::max_abs_diff;
using testing::Net;
using testing::run_ranks;
using testing::train;

// ---------------------------------------------------------------------------------------------
// PowerSGD, on hand-made buckets

// A bucket over `flat` with one gradient per shape, packed in order.
GradBucket make_bucket(at::Tensor flat, const std::vector<std::vector<int64_t>>& shapes,
                       size_t index = 0, bool is_last = true) {
  std::vector<at::Tensor> grads;
  int64_t offset = 0;
  for (const auto& shape : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    grads.push_back(flat.narrow(0, offset, n).view(shape));
    offset += n;
  }
  EXPECT_EQ(offset, flat.numel());
  return GradBucket(index, is_last, flat, grads, {});
}

hooks::PowerSGDOptions psgd(int rank, int64_t start, bool feedback = true, bool warm = true) {
  hooks::PowerSGDOptions o;
  o.matrix_approximation_rank = rank;
  o.start_powerSGD_iter = start;
  o.use_error_feedback = feedback;
  o.warm_start = warm;
  return o;
}

TEST(PowerSGD, OptionsAreValidated) {
  run_ranks(1, [](int, ProcessGroup& pg) {
    auto expect_error = [&](const hooks::PowerSGDOptions& o, const std::string& text) {
      try {
        hooks::PowerSGDState state(borrow(pg), o);
        ADD_FAILURE() << "accepted: " << text;
      } catch (const Error& e) {
        EXPECT_THAT(e.what(), HasSubstr(text));
      }
    };
    expect_error(psgd(0, 10), "matrix_approximation_rank must be >= 1");
    expect_error(psgd(1, 1), "start_powerSGD_iter must be > 1");
    expect_error(psgd(1, 0, true, false), "start_powerSGD_iter must be > 1");
    expect_error(psgd(1, 1, false, true), "start_powerSGD_iter must be > 1");
    expect_error(psgd(1, -1, false, false), "start_powerSGD_iter must be >= 0");
    auto o = psgd(1, 10);
    o.min_compression_rate = -1;
    expect_error(o, "min_compression_rate");
    o = psgd(1, 10);
    o.orthogonalization_epsilon = -1e-8;
    expect_error(o, "orthogonalization_epsilon");
    hooks::PowerSGDState fine(borrow(pg), psgd(1, 0, false, false));  // no state kept: fine
    EXPECT_THROW(hooks::PowerSGDState(nullptr, psgd(1, 10)), Error);
    EXPECT_THROW(hooks::powerSGD(nullptr), Error);
  });
}

// Per rank, a matrix whose SUM over ranks has rank k: ranks' parts differ (each is full rank),
// but one power iteration from any generic Q spans the sum's column space, so a rank >= k
// approximation gives back the exact average (P orthonormal, Q = M^T P, M = P Q^T). Ranks
// 1 and 2 orthogonalise by Gram-Schmidt, higher ones by QR (as PyTorch; Gram-Schmidt cannot
// make a rank-2 P of a rank-1 matrix orthonormal, PyTorch's neither).
TEST(PowerSGD, RecoversLowRankAveragesExactly) {
  const int64_t n = 24, m = 20;
  for (auto [true_rank, approx] :
       std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {2, 3}, {1, 4}}) {
    {
      for (bool warm : {true, false}) {
        torch::manual_seed(3 + true_rank);
        auto u = torch::randn({n, true_rank}), w = torch::randn({m, true_rank});
        auto noise = torch::randn({n, m});   // rank 0 adds it, rank 1 removes it
        auto average = torch::mm(u, w.t());  // the rank-k average
        auto bias = torch::randn({5});
        // Warm start needs warm-up iterations (start 2); compressed steps: a random Q, then
        // (with warm start) last step's Q.
        const int start = warm ? 2 : 0;
        std::vector<std::vector<at::Tensor>> results(2);
        run_ranks(2, [&](int rank, ProcessGroup& pg) {
          auto state =
              std::make_shared<hooks::PowerSGDState>(borrow(pg), psgd(approx, start, false, warm));
          auto hook = hooks::powerSGD(state);
          for (int step = 0; step < start + 2; ++step) {
            auto flat = torch::cat(
                {(average + (rank == 0 ? noise : -noise)).reshape({-1}), bias * (rank + 1)});
            auto bucket = make_bucket(flat, {{n, m}, {5}});
            at::Tensor out = hook(bucket).wait();
            if (step >= start) results[rank].push_back(out.clone());
          }
          EXPECT_EQ(state->p.count(0), warm ? 1u : 0u);
        });
        auto expected = torch::cat({average.reshape({-1}), bias * 1.5});
        for (int rank : {0, 1}) {
          ASSERT_EQ(results[rank].size(), 2u);
          for (const at::Tensor& got : results[rank]) {
            EXPECT_TRUE(torch::allclose(got, expected, 1e-4, 1e-4))
                << "true rank " << true_rank << " approx " << approx << " warm " << warm
                << " max err " << (got - expected).abs().max().item<double>();
          }
        }
        EXPECT_TRUE(torch::equal(results[0][0], results[1][0]));
        EXPECT_TRUE(torch::equal(results[0][1], results[1][1]));
      }
    }
  }
  // A rank-2 average is NOT recovered by a rank-1 approximation (so the test can fail).
  torch::manual_seed(9);
  auto average = torch::mm(torch::randn({n, 2}), torch::randn({m, 2}).t());
  run_ranks(2, [&](int, ProcessGroup& pg) {
    auto state = std::make_shared<hooks::PowerSGDState>(borrow(pg), psgd(1, 0, false, false));
    auto flat = average.reshape({-1}).clone();
    auto bucket = make_bucket(flat, {{n, m}});
    auto out = hooks::powerSGD(state)(bucket).wait();
    EXPECT_GT((out - average.reshape({-1})).abs().max().item<double>(), 1e-2);
  });
}

// With error feedback, what is lost by compression is sent later: the sum of the outputs over T
// steps of a constant gradient G is T*G minus the last error (exactly), so their mean tends to
// G. Without it, every step sends the same rank-1 approximation and the mean stays off.
TEST(PowerSGD, ErrorFeedbackAccumulates) {
  const int64_t n = 16, m = 12;
  const int steps = 120;
  torch::manual_seed(11);
  auto g = torch::randn({n, m});  // full rank; rank-1 compression loses most of it
  double mean_error[2], halfway_error[2];
  for (bool feedback : {false, true}) {
    std::vector<double> err(2), halfway(2);
    run_ranks(2, [&](int rank, ProcessGroup& pg) {
      auto state = std::make_shared<hooks::PowerSGDState>(borrow(pg), psgd(1, 2, feedback, true));
      auto hook = hooks::powerSGD(state);
      auto sum = torch::zeros({n * m});
      for (int step = 0; step < steps + 2; ++step) {
        auto flat = g.reshape({-1}).clone();
        auto bucket = make_bucket(flat, {{n, m}});
        auto out = hook(bucket).wait();
        if (step < 2) {
          EXPECT_TRUE(torch::allclose(out, g.reshape({-1})));  // warm-up: plain average
          EXPECT_EQ(state->error.count(0), 0u);
          continue;
        }
        sum += out;
        if (step - 2 + 1 == steps / 2) {
          halfway[rank] = ((sum / (steps / 2) - g.reshape({-1})).norm() / g.norm()).item<double>();
        }
        if (feedback) {
          // The identity: error = input (G + previous error) - output.
          ASSERT_EQ(state->error.count(0), 1u);
        }
      }
      EXPECT_EQ(state->iter, steps + 2);
      if (feedback) {
        auto residual = g.reshape({-1}) * steps - sum;
        EXPECT_TRUE(torch::allclose(residual, state->error.at(0), 1e-3, 1e-3))
            << (residual - state->error.at(0)).abs().max().item<double>();
      } else {
        EXPECT_EQ(state->error.size(), 0u);
      }
      err[rank] = ((sum / steps - g.reshape({-1})).norm() / g.norm()).item<double>();
    });
    EXPECT_EQ(err[0], err[1]);
    mean_error[feedback] = err[0];
    halfway_error[feedback] = halfway[0];
  }
  // Without feedback: the best rank-1 part of a random 16x12 matrix, far off, and no better
  // with more steps. With it: |last error| / T, shrinking as the steps add up.
  EXPECT_GT(mean_error[false], 0.5);
  EXPECT_NEAR(mean_error[false], halfway_error[false], 1e-3);
  EXPECT_LT(mean_error[true], 0.1 * mean_error[false]);
  EXPECT_LT(mean_error[true], 0.7 * halfway_error[true]);
}

TEST(PowerSGD, WarmupIterationsArePlainAllReduce) {
  const int start = 3;
  auto plain = train(
      2, 5, DdpOptions{},
      [](DataParallel& ddp, std::shared_ptr<ProcessGroup> pg) {
        ddp.register_comm_hook(hooks::allreduce(pg));
      },
      6, 32, 24, 256);
  std::vector<std::shared_ptr<hooks::PowerSGDState>> states(1);
  auto compressed = train(
      2, 5, DdpOptions{},
      [&](DataParallel& ddp, std::shared_ptr<ProcessGroup> pg) {
        auto state = std::make_shared<hooks::PowerSGDState>(pg, psgd(1, start));
        if (pg->rank() == 0) states[0] = state;
        ddp.register_comm_hook(hooks::powerSGD(state));
      },
      6, 32, 24, 256);
  for (int s = 0; s < 5; ++s) {
    double diff = max_abs_diff(Grads{plain[s]}, Grads{compressed[s]});
    if (s < start) {
      EXPECT_EQ(diff, 0.0) << "step " << s;  // also across the bucket rebuild after step 0
    } else {
      EXPECT_GT(diff, 1e-4) << "step " << s;  // compressed from here on
    }
  }
  EXPECT_EQ(states[0]->iter, 5);
  EXPECT_FALSE(states[0]->error.empty());
}

// bytes_reduced: the whole bucket during warm-up; afterwards the uncompressed tensors plus
// P (n x r) and Q (m x r) of each compressed matrix, r = min(n, m, rank).
TEST(PowerSGD, BytesOnTheWireFollowTheFormula) {
  // fc1.weight 64x32, fc1.bias 64, fc2.weight 3x64, fc2.bias 3; one bucket.
  const int64_t all = 64 * 32 + 64 + 3 * 64 + 3;
  struct Case {
    int rank;
    double rate;
    int64_t compressed;  // elements per compressed step
  };
  const Case cases[] = {
      // fc1: (64+32)*4*2 < 2048: P 64x4, Q 32x4. fc2: r = 3, (3+64)*3*2 = 402 > 192: as is.
      {4, 2, 64 + 3 + 64 * 4 + 32 * 4 + 3 * 64},
      // Rate 0.5 lets fc2 be "compressed" with r capped at 3 (201 elements for its 192), and
      // even the biases, as n x 1 matrices with r = 1 (n + 1 elements), as in PyTorch.
      {4, 0.5, (64 + 1) + (3 + 1) + 64 * 4 + 32 * 4 + 3 * 3 + 64 * 3},
      // Rank 1: fc2 (3+64)*2 = 134 < 192: compressed too.
      {1, 2, 64 + 3 + 64 + 32 + 3 + 64},
  };
  for (const Case& c : cases) {
    std::vector<int64_t> per_step;
    int64_t before = 0, after = 0;
    train(
        2, 4, DdpOptions{},
        [&](DataParallel& ddp, std::shared_ptr<ProcessGroup> pg) {
          auto o = psgd(c.rank, 2);
          o.min_compression_rate = c.rate;
          auto state = std::make_shared<hooks::PowerSGDState>(pg, o);
          ddp.register_comm_hook([state, inner = hooks::powerSGD(state), &per_step, &before, &after,
                                  rank = pg->rank()](GradBucket& bucket) {
            const int64_t at_start = state->bytes_reduced;
            // Record each step's bytes once its (only) bucket's future has run.
            return inner(bucket).then(
                [state, at_start, &per_step, &before, &after, rank](at::Tensor t) {
                  if (rank == 0) {
                    per_step.push_back(state->bytes_reduced - at_start);
                    before = state->numel_before_compression;
                    after = state->numel_after_compression;
                  }
                  return t;
                });
          });
        },
        32, 64, 3);
    ASSERT_EQ(per_step.size(), 4u);
    EXPECT_EQ(per_step[0], all * 4);
    EXPECT_EQ(per_step[1], all * 4);
    EXPECT_EQ(per_step[2], c.compressed * 4) << "rank " << c.rank << " rate " << c.rate;
    EXPECT_EQ(per_step[3], c.compressed * 4);
    EXPECT_EQ(before, 2 * all);  // two compressed steps
    EXPECT_EQ(after, 2 * c.compressed);
  }
}

TEST(PowerSGD, TrainsWithManyBucketsAndIdenticalRanks) {
  // Several buckets (rebuilt after step 0), rank 2, error feedback, warm start: every rank must
  // end with the same gradients (train() checks) and they stay finite and close to the plain
  // average's direction.
  auto plain = train(2, 8, DdpOptions{}, nullptr, 6, 32, 24, 512);
  auto compressed = train(
      2, 8, DdpOptions{},
      [](DataParallel& ddp, std::shared_ptr<ProcessGroup> pg) {
        ddp.register_comm_hook(
            hooks::powerSGD(std::make_shared<hooks::PowerSGDState>(pg, psgd(2, 2))));
      },
      6, 32, 24, 512);
  for (size_t s = 0; s < compressed.size(); ++s) {
    for (auto& g : compressed[s]) EXPECT_TRUE(torch::isfinite(g).all().item<bool>());
  }
  auto flat = [](const std::vector<torch::Tensor>& g) {
    std::vector<torch::Tensor> parts;
    for (auto& t : g) parts.push_back(t.reshape({-1}));
    return torch::cat(parts);
  };
  // Compressed steps: the approximation still points roughly the way the true gradient does
  // (a random direction in 1.5k dimensions would give |cos| ~ 0.03).
  for (size_t s = 2; s < compressed.size(); ++s) {
    auto a = flat(plain[s]), b = flat(compressed[s]);
    double cos = torch::dot(a, b).item<double>() / (a.norm() * b.norm()).item<double>();
    EXPECT_GT(cos, 0.3) << "step " << s;
  }
}

}  // namespace
}  // namespace ddprun
