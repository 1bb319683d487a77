// The data-parallel tests' model: a small seeded net with an optional parameter only some
// ranks use (find_unused_parameters), and its gradients.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace ddprun::testing::dp {

struct NetImpl : torch::nn::Module {
  NetImpl(int in, int hidden, int out, bool with_unused = false) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
    if (with_unused) unused = register_module("unused", torch::nn::Linear(3, 3));
    running = register_buffer("running", torch::zeros({2}));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr};
  torch::Tensor running;
};
TORCH_MODULE(Net);

inline Net make_net(uint64_t seed, int hidden = 5, bool with_unused = false) {
  torch::manual_seed(seed);
  return Net(6, hidden, 3, with_unused);
}

inline std::vector<torch::Tensor> grads_of(const Net& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.grad().clone());
  return out;
}

}  // namespace ddprun::testing::dp
