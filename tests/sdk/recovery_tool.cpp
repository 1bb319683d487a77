// Test tool: in-process recovery (ddprun --in-process-recovery, ddprun::TrainingLoop) must end
// with the parameters of a run that never failed, the survivors in the processes they started
// in (tests/sdk/test_in_process_recovery.py). A deterministic MLP, data a function of (rank,
// step), SGD with momentum (optimizer state that must move to the replacement).
//
//   recovery_tool [--steps N] [--kill RANK:STEP] [--kill-replacement 0|1] [--plain 0|1]
//                 [--step-ms MS] [--load FILE]
//
// --kill: that rank SIGKILLs itself in the backward of that step, in the first attempt's first
// process group generation only. --kill-replacement 1: a replacement (a process that joins a later
// generation) SIGKILLs itself before its loop runs: a second failure during the recovery.
// --zero 1: a TrainingLoop over a ZeroRedundancyOptimizer first (refused under the flag).
// --plain 1: the same steps in a plain for loop instead of a TrainingLoop. --step-ms: a pause
// in each step (so that ddprun's standby has started before the kill).
// --load: a checkpoint loaded before wrapping (a replacement skips it: the state comes from a
// survivor). Each rank prints "rank R pid P generation G start" first and
// "rank R pid P params HASH recoveries K transport T" last; HASH covers every parameter byte,
// T is DDP's gradient transport (shared-memory where the host allows, else gloo).
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <thread>

#include "ddprun/ddp.hpp"
#include "tool_util.hpp"

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc0 = register_module("fc0", torch::nn::Linear(6, 32));
    fc1 = register_module("fc1", torch::nn::Linear(32, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(torch::tanh(fc0(x))))); }
  torch::nn::Linear fc0{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

// --kill RANK:STEP (empty: nobody is killed, -1 -1).
std::pair<int, int64_t> kill_point(const std::string& k) {
  if (k.empty()) return {-1, -1};
  return {std::stoi(k.substr(0, k.find(':'))), std::stoll(k.substr(k.find(':') + 1))};
}

// The seeded (x, y) of one step on one rank.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t step, int rank) {
  auto x = torch::sin(torch::arange(96).to(torch::kFloat).reshape({16, 6}) * 0.37 +
                      static_cast<float>(step * 7 + rank * 3));
  auto y = torch::cos(torch::arange(64).to(torch::kFloat).reshape({16, 4}) * 0.23 +
                      static_cast<float>(step + rank));
  return {x, y};
}

// "shared memory" -> "shared-memory": one word for the output line.
std::string one_word(std::string text) {
  for (char& c : text) c = c == ' ' ? '-' : c;
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  auto args = sdk_tool::parse_args(argc, argv,
                                   {{"--steps", "40"},
                                    {"--kill", ""},
                                    {"--kill-replacement", "0"},
                                    {"--load", ""},
                                    {"--plain", "0"},
                                    {"--step-ms", "0"},
                                    {"--zero", "0"}});
  const auto step_pause = std::chrono::milliseconds(std::stoll(args["--step-ms"]));
  const int64_t steps = std::stoll(args["--steps"]);
  const auto [kill_rank, kill_step] = kill_point(args["--kill"]);
  return ddprun::record([&] {
    ddprun::InitOptions init;
    init.backend = ddprun::Backend::kGloo;
    auto pg = ddprun::init_process_group(init);
    const int rank = pg->rank();
    std::printf("rank %d pid %d generation %d start\n", rank, static_cast<int>(::getpid()),
                pg->generation());
    std::fflush(stdout);
    if (pg->generation() > 0 && args["--kill-replacement"] == "1") ::raise(SIGKILL);

    Mlp net;
    sdk_tool::init_deterministic(*net);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    int64_t first = 0;
    if (!args["--load"].empty()) {
      if (auto saved = ddprun::load_checkpoint(*pg, args["--load"], *net, opt)) first = saved->step;
    }
    ddprun::DistributedDataParallel ddp(net, pg);
    if (args["--zero"] == "1") {  // refused under --in-process-recovery: its shards die
      auto zero = ddprun::make_zero<torch::optim::SGD>(net->parameters(), pg,
                                                       torch::optim::SGDOptions(0.05));
      ddprun::TrainingLoop refused(ddp, *net, zero);
    }
    ddprun::TrainingLoop loop(ddp, *net, opt);
    auto step_fn = [&](int64_t step) {
      std::this_thread::sleep_for(step_pause);
      auto [x, y] = batch(step, rank);
      auto loss = torch::mse_loss(ddp(x), y);
      if (rank == kill_rank && step == kill_step && pg->generation() == 0 &&
          pg->env().restart_count == 0) {
        // Dies in the middle of the step: the others wait in its gradients' all-reduce.
        loss.register_hook([](const torch::Tensor& g) {
          ::raise(SIGKILL);
          return g;
        });
      }
      loss.backward();
    };
    if (args["--plain"] == "1") {  // a loop of its own: not one ddprun can recover in process
      for (int64_t step = first; step < steps; ++step) {
        opt.zero_grad();
        step_fn(step);
        opt.step();
      }
    } else {
      loop.run(first, steps, step_fn);
    }
    const std::string transport = one_word(ddp.transport());
    std::printf("rank %d pid %d params %016" PRIx64 " recoveries %d transport %s\n", rank,
                static_cast<int>(::getpid()), sdk_tool::params_hash(*net), loop.recoveries(),
                transport.c_str());
    std::fflush(stdout);
    return 0;
  });
}
