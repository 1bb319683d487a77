// Test tool for ddprun's checkpoint helpers (tests/sdk/test_checkpoint.py).
//   checkpoint_tool save-loop FILE   saves a 64 MiB model over and over, each save's parameters
//                                    all equal to its number; prints "saved N" after each
//   checkpoint_tool verify FILE      loads FILE alone; prints "complete N" when every parameter
//                                    equals the saved step N, exits 1 otherwise
//   checkpoint_tool train FILE       under a launcher: loads FILE if any, else trains a few SGD
//                                    (momentum) steps and rank 0 saves; every rank prints its
//                                    epoch, step and the sums of parameters and momentum buffers
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <iostream>

#include "ddprun/ddp.hpp"

namespace {

torch::nn::Linear big_model() {
  torch::NoGradGuard no_grad;
  return torch::nn::Linear(torch::nn::LinearOptions(4096, 4096).bias(false));
}

int save_loop(const std::string& file) {
  auto model = big_model();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  for (int64_t n = 1;; ++n) {
    {
      torch::NoGradGuard no_grad;
      model->weight.fill_(static_cast<float>(n));
    }
    ddprun::save_checkpoint(file, {0, n, {}}, *model, optimizer);
    std::printf("saved %lld\n", static_cast<long long>(n));
    std::fflush(stdout);
  }
}

int verify(const std::string& file) {
  auto pg = ddprun::new_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1);
  auto model = big_model();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  auto progress = ddprun::load_checkpoint(*pg, file, *model, optimizer);
  if (!progress) throw ddprun::Error("no checkpoint at " + file);
  const float n = static_cast<float>(progress->step);
  if (!torch::equal(model->weight, torch::full_like(model->weight, n))) {
    throw ddprun::Error("checkpoint of step " + std::to_string(progress->step) + " is torn");
  }
  std::printf("complete %lld\n", static_cast<long long>(progress->step));
  return 0;
}

double momentum_sum(torch::optim::SGD& optimizer) {
  double sum = 0;
  for (auto& [key, state] : optimizer.state()) {
    sum += static_cast<torch::optim::SGDParamState&>(*state).momentum_buffer().sum().item<double>();
  }
  return sum;
}

int train(const std::string& file) {
  ddprun::InitOptions o;
  o.backend = ddprun::Backend::kGloo;
  auto pg = ddprun::init_process_group(o);
  torch::manual_seed(100 + pg->rank());  // ranks start apart: a load must make them agree
  torch::nn::Linear model(8, 4);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto progress = ddprun::load_checkpoint(*pg, file, *model, optimizer);
  if (!progress) {
    progress = ddprun::TrainingProgress{};
    torch::manual_seed(7);
    for (; progress->step < 3; ++progress->step) {
      optimizer.zero_grad();
      model(torch::randn({16, 8})).pow(2).mean().backward();
      optimizer.step();
    }
    progress->epoch = 2;
    if (pg->rank() == 0) ddprun::save_checkpoint(file, *progress, *model, optimizer);
  }
  double params = 0;
  for (const auto& p : model->parameters()) params += p.sum().item<double>();
  std::printf("rank %d epoch %lld step %lld params %.17g momentum %.17g\n", pg->rank(),
              static_cast<long long>(progress->epoch),
              static_cast<long long>(progress->step), params, momentum_sum(optimizer));
  std::fflush(stdout);
  pg->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::record([&] {
    const std::string mode = argc == 3 ? argv[1] : "";
    if (mode == "save-loop") return save_loop(argv[2]);
    if (mode == "verify") return verify(argv[2]);
    if (mode == "train") return train(argv[2]);
    throw ddprun::Error("usage: checkpoint_tool save-loop|verify|train FILE");
  });
}
