// C++ side of `scripts/bench ddp`: per-step time of an MLP 1024-2048-2048-10 trained with SGD
// on a batch of 64 per rank, with ddprun's DistributedDataParallel (--mode ddp) or without any
// gradient synchronisation (--mode local). Start it with 2 ranks under ddprun/torchrun; rank 0
// prints `result impl=cpp mode=<mode> step_ms=<slowest rank's mean step time> bytes=<bytes
// handed to all-reduce per timed step>`. Variants of --mode ddp: --find-unused 1
// (DdpOptions::find_unused_parameters); --hook allreduce|powersgd (hooks::powerSGD with
// --psgd-rank, --psgd-start, in one bucket as ddp_bench.py must); --shm, --grad-copy,
// --compression; --optim zero-adam (ZeroRedundancyOptimizer over Adam instead of SGD; the result
// line then adds `state=<largest rank's optimizer state bytes> state_total=<sum over ranks>`).
// ddp_bench.py is the Python/PyTorch DDP twin (same model, data sizes, optimizer, schedule,
// options).
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
  bool find_unused = false;
  std::string hook = "none";  // none | allreduce | powersgd
  int psgd_rank = 4;
  int psgd_start = 2;         // <= warmup: the timed steps are compressed
  std::string optim = "sgd";  // sgd | zero-adam
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
    else if (k == "--find-unused")
      a.find_unused = v == "1";
    else if (k == "--hook")
      a.hook = v;
    else if (k == "--psgd-rank")
      a.psgd_rank = std::stoi(v);
    else if (k == "--psgd-start")
      a.psgd_start = std::stoi(v);
    else if (k == "--optim")
      a.optim = v;
    else
      throw ddprun::Error("ddp_bench: unknown argument " + k);
  }
  if (a.mode != "ddp" && a.mode != "local") throw ddprun::Error("ddp_bench: --mode ddp|local");
  if (a.hook != "none" && a.hook != "allreduce" && a.hook != "powersgd") {
    throw ddprun::Error("ddp_bench: --hook none|allreduce|powersgd");
  }
  if (a.optim != "sgd" && a.optim != "zero-adam") {
    throw ddprun::Error("ddp_bench: --optim sgd|zero-adam");
  }
  if (a.hook == "powersgd" && a.psgd_start > a.warmup) {
    throw ddprun::Error("ddp_bench: --psgd-start must not exceed --warmup (time compressed steps)");
  }
  return a;
}

// --mode ddp: the model wrapped with --compression, --copy-grads, --shared-memory,
// --find-unused and --hook (*psgd: PowerSGD's state, for its byte count).
std::unique_ptr<ddprun::DistributedDataParallel<Mlp>> make_ddp(
    const Args& args, Mlp& model, const std::shared_ptr<ddprun::ProcessGroup>& pg,
    std::shared_ptr<ddprun::hooks::PowerSGDState>* psgd) {
  ddprun::DdpOptions o;
  if (args.compression == "fp16") o.compression = ddprun::GradCompression::kFp16;
  if (args.compression == "bf16") o.compression = ddprun::GradCompression::kBf16;
  o.gradient_as_bucket_view = !args.copy_grads;
  o.shared_memory = args.shared_memory;
  o.find_unused_parameters = args.find_unused;
  if (args.hook == "powersgd") o.first_bucket_cap_bytes = 64 << 20;  // one bucket
  auto ddp = std::make_unique<ddprun::DistributedDataParallel<Mlp>>(model, pg, o);
  if (args.hook == "powersgd") {
    ddprun::hooks::PowerSGDOptions po;
    po.matrix_approximation_rank = args.psgd_rank;
    po.start_powerSGD_iter = args.psgd_start;
    *psgd = std::make_shared<ddprun::hooks::PowerSGDState>(pg, po);
    ddp->register_comm_hook(ddprun::hooks::powerSGD(*psgd));
  } else if (args.hook == "allreduce") {
    ddp->register_comm_hook(ddprun::hooks::allreduce(pg));
  }
  return ddp;
}

// --optim: SGD, or Adam sharded by ZeroRedundancyOptimizer (*zero then points at it).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const Args& args, Mlp& model, const std::shared_ptr<ddprun::ProcessGroup>& pg,
    ddprun::ZeroRedundancyOptimizer** zero) {
  if (args.optim != "zero-adam") {
    return std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.01));
  }
  auto z = std::make_unique<ddprun::ZeroRedundancyOptimizer>(
      model->parameters(), pg, [](std::vector<torch::Tensor> shard) {
        return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(1e-3));
      });
  *zero = z.get();
  return z;
}

// " state=<the largest rank's optimizer state bytes> state_total=<all ranks'>" (collective).
std::string state_text(ddprun::ZeroRedundancyOptimizer& zero, ddprun::ProcessGroup& pg) {
  auto mine = torch::tensor({zero.local_state_bytes()}, torch::kLong);
  auto largest = mine.clone(), total = mine.clone();
  pg.all_reduce(largest, ddprun::ReduceOp::kMax);
  pg.all_reduce(total);
  return " state=" + std::to_string(largest.item<int64_t>()) +
         " state_total=" + std::to_string(total.item<int64_t>());
}

int run(int argc, char** argv) {
  Args args = parse(argc, argv);
  ddprun::InitOptions init;
  init.backend = ddprun::Backend::kGloo;
  auto pg = ddprun::init_process_group(init);
  torch::manual_seed(0);
  Mlp model;
  std::unique_ptr<ddprun::DistributedDataParallel<Mlp>> ddp;
  std::shared_ptr<ddprun::hooks::PowerSGDState> psgd;
  if (args.mode == "ddp") ddp = make_ddp(args, model, pg, &psgd);
  // Bytes handed to all-reduce so far: PowerSGD counts its own; otherwise every bucket, once
  // per step (the unused-parameter flags of find_unused_parameters not counted).
  auto bytes_so_far = [&](int64_t steps_done) -> int64_t {
    if (psgd) return psgd->bytes_reduced;
    int64_t per_step = 0;
    if (ddp) {
      for (const auto& b : ddp->buckets()) per_step += b.bytes;
    }
    return per_step * steps_done;
  };
  torch::manual_seed(1 + pg->rank());
  auto x = torch::randn({args.batch, 1024});
  auto y = torch::randint(0, 10, {args.batch}, torch::kLong);
  ddprun::ZeroRedundancyOptimizer* zero = nullptr;
  std::unique_ptr<torch::optim::Optimizer> opt = make_optimizer(args, model, pg, &zero);

  auto step = [&] {
    opt->zero_grad();
    auto out = ddp ? (*ddp)(x) : model->forward(x);
    torch::nn::functional::cross_entropy(out, y).backward();
    opt->step();
  };
  for (int i = 0; i < args.warmup; ++i) step();
  pg->barrier();
  const int64_t bytes0 = bytes_so_far(args.warmup);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < args.steps; ++i) step();
  auto t1 = std::chrono::steady_clock::now();
  const int64_t bytes_per_step = (bytes_so_far(args.warmup + args.steps) - bytes0) / args.steps;
  double ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / args.steps;
  auto t = torch::tensor({ms}, torch::kDouble);
  pg->all_reduce(t, ddprun::ReduceOp::kMax);
  const std::string state = zero ? state_text(*zero, *pg) : std::string();
  if (pg->rank() == 0) {
    std::printf("result impl=cpp mode=%s step_ms=%.3f bytes=%lld%s\n", args.mode.c_str(),
                t.item<double>(), static_cast<long long>(bytes_per_step), state.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::record([&] { return run(argc, argv); });
}
