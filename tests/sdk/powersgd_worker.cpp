// Test tool: trains a small MLP with DDP and a communication hook (PowerSGD or plain
// all-reduce) on deterministic data, recording the loss and the bytes the hook all-reduced at
// every step. powersgd_ref.py does the same with PyTorch's powerSGD_hook; test_comm_hooks.py
// compares the two (convergence, and bytes on the wire).
//
//   powersgd_worker --model small|bench --hook powersgd|allreduce --steps N --rank R
//                   --start S --seed K --out DIR
//
// "small": 32-64-8 MLP regressing a fixed random teacher (SGD, momentum 0.9); "bench": the
// benchmark's 1024-2048-2048-10 MLP (bytes only). Rank 0 writes DIR/cpp.json:
// {"loss": [per step, averaged over ranks], "bytes": [per step, this rank's], "iter": N}.
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "ddprun/ddp.hpp"
#include "tool_util.hpp"

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t hidden2, int64_t out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    if (hidden2 > 0) fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden2));
    fc3 = register_module("fc3", torch::nn::Linear(hidden2 > 0 ? hidden2 : hidden, out));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x));
    if (fc2) x = torch::relu(fc2(x));
    return fc3(x);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

// Parameter k ~ N(0, 1/fan_in) from seed 1000 + k: the same numbers PyTorch draws.
void init_weights(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  int k = 0;
  for (auto& p : m.parameters()) {
    torch::manual_seed(1000 + k);
    const double fan_in = p.dim() > 1 ? static_cast<double>(p.size(1)) : 16.0;
    p.copy_(torch::randn(p.sizes()) / std::sqrt(fan_in));
    ++k;
  }
}

// Data: 512 samples of a teacher y = tanh(x T1) T2 (rank r trains on samples r, r+2, ...,
// 32 per step); for the bench model random inputs and classes, as the benchmark.
std::pair<torch::Tensor, torch::Tensor> rank_data(bool bench, int rank, int world) {
  const int64_t in = bench ? 1024 : 32, out = bench ? 10 : 8;
  torch::manual_seed(7);
  auto x_all = torch::randn({512, in});
  torch::Tensor y_all;
  if (bench) {
    y_all = torch::randint(0, out, {512}, torch::kLong);
  } else {
    auto t1 = torch::randn({in, 16}) / std::sqrt(static_cast<double>(in));
    auto t2 = torch::randn({16, out});
    y_all = torch::mm(torch::tanh(torch::mm(x_all, t1)), t2);
  }
  auto mine = torch::arange(rank, 512, world, torch::kLong);
  return {x_all.index_select(0, mine), y_all.index_select(0, mine)};
}

// --hook: PowerSGD (its state kept in `state`, which counts its bytes) or plain all-reduce
// (its bytes added to `plain_bytes`).
template <typename Ddp>
void register_hook(Ddp& ddp, std::map<std::string, std::string>& args,
                   const std::shared_ptr<ddprun::ProcessGroup>& pg,
                   std::shared_ptr<ddprun::hooks::PowerSGDState>& state, int64_t& plain_bytes) {
  if (args["--hook"] == "powersgd") {
    ddprun::hooks::PowerSGDOptions o;
    o.matrix_approximation_rank = std::stoi(args["--rank"]);
    o.start_powerSGD_iter = std::stoi(args["--start"]);
    o.random_seed = std::stoull(args["--seed"]);
    state = std::make_shared<ddprun::hooks::PowerSGDState>(pg, o);
    ddp.register_comm_hook(ddprun::hooks::powerSGD(state));
  } else {
    auto inner = ddprun::hooks::allreduce(pg);
    ddp.register_comm_hook([inner, &plain_bytes](ddprun::GradBucket& bucket) {
      plain_bytes += bucket.buffer().numel() * static_cast<int64_t>(bucket.buffer().element_size());
      return inner(bucket);
    });
  }
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::record([&] {
    auto args = sdk_tool::parse_args(argc, argv,
                                     {{"--model", "small"},
                                      {"--hook", "powersgd"},
                                      {"--steps", "100"},
                                      {"--rank", "2"},
                                      {"--start", "10"},
                                      {"--seed", "0"}});
    const bool bench = args["--model"] == "bench";
    const int steps = std::stoi(args["--steps"]);

    ddprun::InitOptions io;
    io.backend = ddprun::Backend::kGloo;
    auto pg = ddprun::init_process_group(io);
    const int rank = pg->rank();

    Mlp net = bench ? Mlp(1024, 2048, 2048, 10) : Mlp(32, 64, 0, 8);
    init_weights(*net);
    auto [x_rank, y_rank] = rank_data(bench, rank, pg->size());

    ddprun::DistributedDataParallel ddp(net, pg);
    std::shared_ptr<ddprun::hooks::PowerSGDState> state;
    int64_t plain_bytes = 0;
    register_hook(ddp, args, pg, state, plain_bytes);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    std::vector<double> losses, bytes;
    int64_t last_bytes = 0;
    const int64_t batch = bench ? 64 : 32, chunks = x_rank.size(0) / batch;
    for (int step = 0; step < steps; ++step) {
      auto x = x_rank.narrow(0, (step % chunks) * batch, batch);
      auto y = y_rank.narrow(0, (step % chunks) * batch, batch);
      opt.zero_grad();
      auto pred = ddp(x);
      auto loss = bench ? torch::nn::functional::cross_entropy(pred, y) : torch::mse_loss(pred, y);
      loss.backward();
      opt.step();
      const int64_t now = state ? state->bytes_reduced : plain_bytes;
      bytes.push_back(static_cast<double>(now - last_bytes));
      last_bytes = now;
      auto l = loss.detach().clone();
      pg->all_reduce(l, ddprun::ReduceOp::kAvg);
      losses.push_back(l.item<double>());
    }
    if (rank == 0) {
      std::ofstream(args["--out"] + "/cpp.json")
          << "{\"loss\": " << sdk_tool::json_list(losses)
          << ", \"bytes\": " << sdk_tool::json_list(bytes)
          << ", \"iter\": " << (state ? state->iter : steps) << "}\n";
    }
    pg->barrier();
    return 0;
  });
}
