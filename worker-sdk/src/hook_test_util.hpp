// Test helpers for DDP and its communication hooks: a small seeded net, and training it on
// several ranks (threads) with a setup applied to the wrapper, collecting the gradients.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "ddprun/data_parallel.hpp"
#include "test_ranks.hpp"

namespace ddprun::testing {

// A ProcessGroup the test owns, as the shared_ptr the SDK takes.
inline std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) {
  return std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {});
}

struct NetImpl : torch::nn::Module {
  NetImpl(int in, int hidden, int out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

inline Net make_net(int in = 6, int hidden = 16, int out = 3) {
  torch::manual_seed(7);
  return Net(in, hidden, out);
}

using Grads = std::vector<std::vector<torch::Tensor>>;  // [step][parameter]

// Trains a fresh copy of make_net() on `world` ranks for `steps` SGD steps (each rank its own
// data), with `setup` applied to the wrapper (e.g. registering a hook); returns rank 0's
// gradients after each backward, and checks that every rank saw the same ones.
inline Grads train(int world, int steps, const DdpOptions& options,
                   const std::function<void(DataParallel&, std::shared_ptr<ProcessGroup>)>& setup,
                   int in = 6, int hidden = 16, int out = 3, int64_t first_bucket = 0) {
  std::vector<Grads> per_rank(world);
  // Models and data made up front: the global RNG is not to be shared by the rank threads.
  std::vector<Net> nets;
  std::vector<std::vector<torch::Tensor>> xs(world), ys(world);
  for (int rank = 0; rank < world; ++rank) {
    nets.push_back(make_net(in, hidden, out));
    torch::manual_seed(100 + rank);
    for (int s = 0; s < steps; ++s) {
      xs[rank].push_back(torch::randn({8, in}));
      ys[rank].push_back(torch::randn({8, out}));
    }
  }
  run_ranks(world, [&](int rank, ProcessGroup& pg) {
    Net net = nets[rank];
    DdpOptions o = options;
    if (first_bucket > 0) {
      o.first_bucket_cap_bytes = first_bucket;
      o.bucket_cap_bytes = first_bucket;
    }
    DistributedDataParallel ddp(net, borrow(pg), o);
    if (setup) setup(ddp, borrow(pg));
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int s = 0; s < steps; ++s) {
      const auto& x = xs[rank][s];
      const auto& y = ys[rank][s];
      opt.zero_grad();
      torch::mse_loss(ddp(x), y).backward();
      std::vector<torch::Tensor> g;
      for (auto& p : net->parameters()) g.push_back(p.grad().clone());
      per_rank[rank].push_back(g);
      opt.step();
    }
  });
  for (int r = 1; r < world; ++r) {
    for (int s = 0; s < steps; ++s) {
      for (size_t i = 0; i < per_rank[0][s].size(); ++i) {
        EXPECT_TRUE(torch::equal(per_rank[0][s][i], per_rank[r][s][i]))
            << "rank " << r << " step " << s << " param " << i << " differs from rank 0's";
      }
    }
  }
  return per_rank[0];
}

inline double max_abs_diff(const Grads& a, const Grads& b) {
  double worst = 0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size() && s < b.size(); ++s) {
    for (size_t i = 0; i < a[s].size(); ++i) {
      worst = std::max(worst, (a[s][i] - b[s][i]).abs().max().item<double>());
    }
  }
  return worst;
}

}  // namespace ddprun::testing
