// The model: an MLP classifier, features -> hidden -> hidden -> classes.
#pragma once

#include <torch/torch.h>

namespace train {

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t classes)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, classes))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }

  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

}  // namespace train
