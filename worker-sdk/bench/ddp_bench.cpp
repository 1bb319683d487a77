// C++ side of `scripts/bench ddp`: per-step time of an MLP 1024-2048-2048-10 trained with SGD
// on a batch of 64 per rank, with ddprun's DistributedDataParallel (--mode ddp) or without any
// gradient synchronisation (--mode local). Start it with 2 ranks under ddprun/torchrun; rank 0
// prints `result impl=cpp mode=<mode> step_ms=<slowest rank's mean step time>`.
// ddp_bench.py is the Python/PyTorch DDP twin (same model, data sizes, optimizer, schedule).
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "ddprun/ddp.hpp"

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(1024, 2048))),
        fc2(register_module("fc2", torch::nn::Linear(2048, 2048))),
        fc3(register_module("fc3", torch::nn::Linear(2048, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

struct Args {
  std::string mode = "ddp";
  int warmup = 5;
  int steps = 30;
  int batch = 64;
  std::string compression = "none";
  bool copy_grads = false;  // gradient_as_bucket_view = false
  bool shared_memory = true;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode")
      a.mode = v;
    else if (k == "--warmup")
      a.warmup = std::stoi(v);
    else if (k == "--steps")
      a.steps = std::stoi(v);
    else if (k == "--batch")
      a.batch = std::stoi(v);
    else if (k == "--compression")
      a.compression = v;
    else if (k == "--grad-copy")
      a.copy_grads = v == "1";
    else if (k == "--shm")
      a.shared_memory = v == "1";
    else
      throw ddprun::Error("ddp_bench: unknown argument " + k);
  }
  if (a.mode != "ddp" && a.mode != "local") throw ddprun::Error("ddp_bench: --mode ddp|local");
  return a;
}

int run(int argc, char** argv) {
  Args args = parse(argc, argv);
  ddprun::InitOptions init;
  init.backend = ddprun::Backend::kGloo;
  auto pg = ddprun::init_process_group(init);
  torch::manual_seed(0);
  Mlp model;
  std::unique_ptr<ddprun::DistributedDataParallel<Mlp>> ddp;
  if (args.mode == "ddp") {
    ddprun::DdpOptions o;
    if (args.compression == "fp16") o.compression = ddprun::GradCompression::kFp16;
    if (args.compression == "bf16") o.compression = ddprun::GradCompression::kBf16;
    o.gradient_as_bucket_view = !args.copy_grads;
    o.shared_memory = args.shared_memory;
    ddp = std::make_unique<ddprun::DistributedDataParallel<Mlp>>(model, pg, o);
  }
  torch::manual_seed(1 + pg->rank());
  auto x = torch::randn({args.batch, 1024});
  auto y = torch::randint(0, 10, {args.batch}, torch::kLong);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01));

  auto step = [&] {
    opt.zero_grad();
    auto out = ddp ? (*ddp)(x) : model->forward(x);
    torch::nn::functional::cross_entropy(out, y).backward();
    opt.step();
  };
  for (int i = 0; i < args.warmup; ++i) step();
  pg->barrier();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < args.steps; ++i) step();
  auto t1 = std::chrono::steady_clock::now();
  double ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / args.steps;
  auto t = torch::tensor({ms}, torch::kDouble);
  pg->all_reduce(t, ddprun::ReduceOp::kMax);
  if (pg->rank() == 0) {
    std::printf("result impl=cpp mode=%s step_ms=%.3f\n", args.mode.c_str(), t.item<double>());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::record([&] { return run(argc, argv); });
}
