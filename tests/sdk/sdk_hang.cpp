// Test worker: a tiny data-parallel training over Gloo with the worker SDK, whose rank 1 hangs on
// the first attempt. It never calls ddprun::heartbeat(): the SDK beats on its own after every
// collective and every synchronised backward, which is what `ddprun --hang-timeout` watches.
//
//   sdk_hang [--steps N] [--step-ms MS] [--hang-rank R] [--hang-step S]
//
// Every step sleeps MS milliseconds (so a run lasts longer than the hang timeout, and beats must
// keep coming). On attempt 0 (TORCHELASTIC_RESTART_COUNT=0) rank R, at step S, sleeps forever
// before backward. Rank 0 prints "sdk_hang done attempt=A steps=N checksum=C" at the end.
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <string>
#include <thread>

#include "ddprun/ddp.hpp"

namespace {

struct Options {
  int steps = 20;
  int step_ms = 250;
  int hang_rank = 1;
  int hang_step = 5;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> int {
      if (i + 1 >= argc) throw ddprun::Error("sdk_hang: " + a + " needs a value");
      return std::atoi(argv[++i]);
    };
    if (a == "--steps") {
      o.steps = value();
    } else if (a == "--step-ms") {
      o.step_ms = value();
    } else if (a == "--hang-rank") {
      o.hang_rank = value();
    } else if (a == "--hang-step") {
      o.hang_step = value();
    } else {
      throw ddprun::Error("sdk_hang: unknown argument " + a);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::record([&] {
    const Options opt = parse(argc, argv);
    ddprun::InitOptions init;
    init.backend = ddprun::Backend::kGloo;
    auto pg = ddprun::init_process_group(init);
    const int rank = pg->rank();
    const int attempt = pg->env().restart_count;

    torch::manual_seed(0);
    torch::nn::Linear model(4, 1);
    ddprun::DistributedDataParallel ddp(model, pg);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05));
    auto x = torch::randn({8, 4}) + static_cast<double>(rank);
    auto y = x.sum(1, /*keepdim=*/true);

    for (int step = 0; step < opt.steps; ++step) {
      optimizer.zero_grad();
      auto loss = torch::mse_loss(ddp(x), y);
      if (rank == opt.hang_rank && attempt == 0 && step == opt.hang_step) {
        std::cerr << "[sdk_hang] rank " << rank << ": stuck before backward at step " << step
                  << std::endl;
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      }
      loss.backward();
      optimizer.step();
      std::this_thread::sleep_for(std::chrono::milliseconds(opt.step_ms));
    }
    double checksum = 0;
    for (const auto& p : model->parameters()) checksum += p.detach().sum().item<double>();
    if (rank == 0) {
      std::cout << "sdk_hang done attempt=" << attempt << " steps=" << opt.steps
                << " checksum=" << std::setprecision(12) << checksum << std::endl;
    }
    return 0;
  });
}
