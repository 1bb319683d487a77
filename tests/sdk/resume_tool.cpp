// Test tool: training resumed from a checkpoint must equal training that never stopped
// (tests/sdk/test_resume.py). A deterministic MLP and data; two ranks under a launcher.
//
//   resume_tool --phase whole|save|resume --optim sgd|zero-adam --order wrap-then-load|
//               load-then-wrap --ckpt FILE [--tamper none|set-same|set-shape]
//
// whole: 10 steps. save: 5 steps, then a checkpoint. resume: a fresh model (initialised apart
// from the saved one on each rank), loaded and wrapped in --order, then steps 5 to 9. Every
// rank prints "rank R params HASH sum S rebuilt B": HASH covers the bytes of every parameter,
// so equal hashes mean bitwise equal models.
// --tamper (resume only): after wrapping and loading, each parameter is given new storage with
// Tensor::set_ (set-same: the same values and shape, which DDP must survive; set-shape: the
// first parameter a different shape, which DDP must refuse naming it).
#include <torch/torch.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "ddprun/ddp.hpp"
#include "tool_util.hpp"

namespace {

constexpr int kSplit = 5;
constexpr int kSteps = 10;

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc0 = register_module("fc0", torch::nn::Linear(6, 16));
    fc1 = register_module("fc1", torch::nn::Linear(16, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    return fc2(torch::tanh(fc1(torch::tanh(fc0(x)))));
  }
  torch::nn::Linear fc0{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

// One step on this rank's data (different on each rank, so that an un-averaged step shows).
void step_once(ddprun::DistributedDataParallel<Mlp>& ddp, torch::optim::Optimizer& opt,
               int64_t step) {
  const int rank = ddp.process_group().rank();
  opt.zero_grad();
  auto x = torch::sin(torch::arange(48).to(torch::kFloat).reshape({8, 6}) * 0.37 +
                      static_cast<float>(step * 7 + rank * 3));
  auto y = torch::cos(torch::arange(32).to(torch::kFloat).reshape({8, 4}) * 0.23 +
                      static_cast<float>(step + rank));
  torch::mse_loss(ddp(x), y).backward();
  opt.step();
}

// Given new storage with Tensor::set_, after wrapping and loading.
void tamper(Mlp& net, const std::string& how) {
  torch::NoGradGuard no_grad;
  for (auto& p : net->parameters()) {
    if (how == "set-same") p.set_(p.detach().clone());  // same values and shape
    if (how == "set-shape") {
      p.set_(torch::zeros({p.numel() + 1}));  // the first parameter only
      return;
    }
  }
}

void report(ddprun::ProcessGroup& pg, Mlp& net, bool rebuilt) {
  const uint64_t hash = sdk_tool::params_hash(*net);
  double sum = 0;
  for (const auto& p : net->parameters()) sum += p.detach().sum().item<double>();
  std::printf("rank %d params %016" PRIx64 " sum %.9g rebuilt %d\n", pg.rank(), hash, sum,
              rebuilt ? 1 : 0);
  std::fflush(stdout);
}

struct Run {
  std::shared_ptr<ddprun::ProcessGroup> pg;
  Mlp net;
  std::string path;
  int64_t steps = kSteps;    // train up to this step
  int64_t save_at = -1;      // save the checkpoint after this many steps
  std::string tamper = "none";
  int64_t first_step = kSplit;  // where a resumed run starts
};

// One step, and before the first step of a resumed run the --tamper (after the load).
struct TrainStep {
  Run& r;
  template <typename Opt>
  void operator()(ddprun::DistributedDataParallel<Mlp>& ddp, Opt& opt, int64_t step) const {
    if (step == r.first_step) tamper(r.net, r.tamper);
    step_once(ddp, opt, step);
  }
};

// The names the README's code uses.
struct Names {
  std::shared_ptr<ddprun::ProcessGroup> pg;
  Mlp net;
  std::string path;
  int64_t steps, save_at;
  TrainStep train_step;
};
Names names(Run& r) {
  return {r.pg, r.net, r.path, r.steps, r.save_at, TrainStep{r}};
}

// The resume of worker-sdk/README.md ("Checkpoints"), word for word between the markers.
void sgd_wrap_then_load(Run& r) {
  auto [pg, net, path, steps, save_at, train_step] = names(r);
  // README resume-sgd begin
  ddprun::DistributedDataParallel ddp(net, pg);  // wrap, then load, or the other way round
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ddprun::TrainingProgress progress;             // step 0: a fresh start
  if (auto saved = ddprun::load_checkpoint(*pg, path, *net, opt)) progress = *saved;
  for (int64_t step = progress.step; step < steps; ++step) {
    train_step(ddp, opt, step);
    if (step + 1 == save_at && pg->rank() == 0) {
      ddprun::save_checkpoint(path, {0, step + 1, {}}, *net, opt);
    }
  }
  // README resume-sgd end
  report(*pg, net, ddp.buckets_rebuilt());
}

// The ZeRO resume of worker-sdk/README.md ("ZeroRedundancyOptimizer"), word for word.
void zero_wrap_then_load(Run& r) {
  auto [pg, net, path, steps, save_at, train_step] = names(r);
  // README resume-zero begin
  ddprun::DistributedDataParallel ddp(net, pg);
  auto opt = ddprun::make_zero<torch::optim::Adam>(net->parameters(), pg,
                                                   torch::optim::AdamOptions(0.01));
  ddprun::TrainingProgress progress;
  if (auto saved = ddprun::load_checkpoint(*pg, path, *net, opt)) progress = *saved;
  for (int64_t step = progress.step; step < steps; ++step) {
    train_step(ddp, opt, step);
    if (step + 1 == save_at) {
      opt.consolidate_state_dict(0);  // collective: every shard's state to rank 0
      if (pg->rank() == 0) ddprun::save_checkpoint(path, {0, step + 1, {}}, *net, opt);
    }
  }
  // README resume-zero end
  report(*pg, net, ddp.buckets_rebuilt());
}

// Load first, then wrap: the order that always worked.
void load_then_wrap(Run& r, const std::string& optim) {
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (optim == "sgd") {
    opt = std::make_unique<torch::optim::SGD>(r.net->parameters(),
                                              torch::optim::SGDOptions(0.1).momentum(0.9));
  } else {
    opt = std::make_unique<ddprun::ZeroRedundancyOptimizer>(
        r.net->parameters(), r.pg,
        [](std::vector<torch::Tensor> shard) -> std::unique_ptr<torch::optim::Optimizer> {
          return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(0.01));
        });
  }
  auto saved = ddprun::load_checkpoint(*r.pg, r.path, *r.net, *opt);
  if (!saved) throw ddprun::Error("no checkpoint at " + r.path);
  ddprun::DistributedDataParallel ddp(r.net, r.pg);
  for (int64_t step = saved->step; step < r.steps; ++step) step_once(ddp, *opt, step);
  report(*r.pg, r.net, ddp.buckets_rebuilt());
}

int run(std::map<std::string, std::string> args) {
  ddprun::InitOptions io;
  io.backend = ddprun::Backend::kGloo;
  Run r{ddprun::init_process_group(io), Mlp(), args["--ckpt"]};
  const std::string phase = args["--phase"];
  if (phase == "resume") {
    torch::manual_seed(1000 + r.pg->rank());  // apart from the checkpoint, and from each other
    r.tamper = args["--tamper"];
  } else {
    sdk_tool::init_deterministic(*r.net);
    if (phase == "save") {
      r.steps = r.save_at = kSplit;
    } else {
      r.path = r.path + ".absent";  // nothing to resume from
    }
  }
  if (phase == "resume" && args["--order"] == "load-then-wrap") {
    load_then_wrap(r, args["--optim"]);
  } else if (args["--optim"] == "sgd") {
    sgd_wrap_then_load(r);
  } else if (args["--optim"] == "zero-adam") {
    zero_wrap_then_load(r);
  } else {
    throw ddprun::Error("--optim: sgd or zero-adam");
  }
  r.pg->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::record([&] {
    return run(sdk_tool::parse_args(argc, argv,
                                    {{"--phase", "whole"},
                                     {"--optim", "sgd"},
                                     {"--order", "wrap-then-load"},
                                     {"--ckpt", ""},
                                     {"--tamper", "none"}}));
  });
}
