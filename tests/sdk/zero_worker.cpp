// Test tool: a few steps of DDP with ddprun::ZeroRedundancyOptimizer on a small deterministic
// MLP, mirrored line for line by zero_ref.py with PyTorch's DistributedDataParallel and
// ZeroRedundancyOptimizer, so test_zero.py can compare the final parameters, the partition and
// the per-rank optimizer state.
//
//   zero_worker --optim sgd|adam --sizes 6,16,16,4 --steps N [--bucket-view 0|1]
//               [--params 0|1] --out DIR
//
// Writes DIR/cpp_rank<R>.json: {"params": {name: [...]} (unless --params 0), "owners": [rank of
// each parameter], "numels": [...], "local_state_bytes": n}.
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ddprun/ddp.hpp"
#include "tool_util.hpp"

namespace {

// fc0, fc1, ...: Linear layers of the given sizes with tanh between them.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const std::vector<int64_t>& sizes) {
    for (size_t i = 0; i + 1 < sizes.size(); ++i) {
      layers.push_back(
          register_module("fc" + std::to_string(i), torch::nn::Linear(sizes[i], sizes[i + 1])));
    }
    sdk_tool::init_deterministic(*this);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i) {
      x = layers[i](x);
      if (i + 1 < layers.size()) x = torch::tanh(x);
    }
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};
TORCH_MODULE(Mlp);

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> sizes;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) sizes.push_back(std::stoll(item));
  return sizes;
}

// --optim adam|sgd: what each rank's shard is optimized with.
ddprun::ZeroRedundancyOptimizer::OptimizerFactory factory_for(const std::string& optim) {
  if (optim == "adam") {
    return [](std::vector<torch::Tensor> shard) -> std::unique_ptr<torch::optim::Optimizer> {
      return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(0.01));
    };
  }
  return [](std::vector<torch::Tensor> shard) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(shard, torch::optim::SGDOptions(0.1).momentum(0.9));
  };
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::record([&] {
    auto args = sdk_tool::parse_args(argc, argv,
                                     {{"--optim", "sgd"},
                                      {"--sizes", "6,16,16,4"},
                                      {"--steps", "5"},
                                      {"--bucket-view", "0"},
                                      {"--params", "1"}});
    const auto sizes = parse_sizes(args["--sizes"]);
    const int steps = std::stoi(args["--steps"]);

    ddprun::InitOptions io;
    io.backend = ddprun::Backend::kGloo;
    auto pg = ddprun::init_process_group(io);
    const int rank = pg->rank();
    Mlp net(sizes);
    ddprun::DistributedDataParallel ddp(net, pg);
    ddprun::ZeroOptions zo;
    zo.parameters_as_bucket_view = args["--bucket-view"] == "1";
    ddprun::ZeroRedundancyOptimizer opt(net->parameters(), pg, factory_for(args["--optim"]), zo);

    const int64_t batch = 8, in = sizes.front(), out_dim = sizes.back();
    for (int step = 0; step < steps; ++step) {
      opt.zero_grad();
      auto base = torch::arange(batch * in).to(torch::kFloat).reshape({batch, in});
      auto x = torch::sin(base * 0.37 + static_cast<float>(step * 7 + rank * 3));
      auto y = torch::cos(
          torch::arange(batch * out_dim).to(torch::kFloat).reshape({batch, out_dim}) * 0.23 +
          static_cast<float>(step + rank));
      torch::mse_loss(ddp(x), y).backward();
      opt.step();
    }

    std::ostringstream out;
    out.precision(9);
    out << "{\"params\": {";
    std::vector<int64_t> numels;
    bool first = true;
    for (const auto& item : net->named_parameters()) {
      numels.push_back(item.value().numel());
      if (args["--params"] != "1") continue;
      auto v = item.value().detach().reshape({-1});
      auto acc = v.accessor<float, 1>();
      out << (first ? "" : ", ") << "\"" << item.key() << "\": [";
      for (int64_t i = 0; i < v.numel(); ++i) out << (i ? "," : "") << acc[i];
      out << "]";
      first = false;
    }
    out << "}, \"owners\": " << sdk_tool::json_list(opt.owners())
        << ", \"numels\": " << sdk_tool::json_list(numels)
        << ", \"local_state_bytes\": " << opt.local_state_bytes() << "}\n";
    std::ofstream(args["--out"] + "/cpp_rank" + std::to_string(rank) + ".json") << out.str();
    pg->barrier();
    return 0;
  });
}
