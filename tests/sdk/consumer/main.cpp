#include <torch/torch.h>
#include <ddprun/ddp.hpp>
#include <iostream>

int main() {
  return ddprun::record([] {                   // uncaught errors -> torchelastic error file
    auto pg = ddprun::init_process_group();    // RANK, WORLD_SIZE, MASTER_ADDR, ... from ddprun
    torch::manual_seed(0);
    auto net = torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                                     torch::nn::Linear(32, 4));
    net->to(pg->device());
    ddprun::DistributedDataParallel ddp(net, pg);  // same weights on every rank from here on
    torch::optim::SGD opt(net->parameters(), 0.1);

    // Each rank trains on its share of the data, chosen exactly as Python's sampler would.
    auto x = torch::randn({256, 16}), y = torch::randint(0, 4, {256});
    ddprun::DistributedSampler sampler(256, pg->size(), pg->rank());
    for (int epoch = 0; epoch < 3; ++epoch) {
      sampler.set_epoch(epoch);
      auto idx = torch::tensor(sampler.indices());
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(ddp(x.index_select(0, idx)),
                                                       y.index_select(0, idx));
      loss.backward();                           // gradients averaged across ranks
      opt.step();
      pg->all_reduce(loss, ddprun::ReduceOp::kAvg);
      if (pg->rank() == 0) std::cout << "epoch " << epoch << " loss " << loss.item<float>() << "\n";
    }
    std::cout << "rank " << pg->rank() << " of " << pg->size() << " done" << std::endl;
    return 0;
  });
}
