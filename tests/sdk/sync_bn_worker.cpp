// Test tool: a few SGD steps of a small conv + linear model whose BatchNorm2d and BatchNorm1d
// are converted by ddprun::convert_sync_batchnorm and wrapped in DistributedDataParallel, each
// rank training on its slice of one global batch. sync_bn_ref.py runs the same model with plain
// BatchNorm on the whole batch in one process (keep the two in step); test_sync_batchnorm.py
// compares them.
//
//   sync_bn_worker --split even|uneven|empty --loss scaled|mean --steps N --out DIR
//
// Writes DIR/cpp_rank<R>.json: {"rows": [first, count], "converted": [paths],
// "params": {name: [...]}, "buffers": {name: [...]}, "outputs": [[step 0 rows, flat], ...],
// "eval_output": [...]} (eval_output: the trained model in eval mode on the whole batch).
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ddprun/ddp.hpp"
#include "tool_util.hpp"

namespace {

constexpr int64_t kBatch = 8;

// Weights from a formula, not an RNG, so that both sides start identically.
void init_deterministic(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  int k = 0;
  for (auto& p : m.parameters()) {
    auto t = torch::arange(p.numel()).to(torch::kFloat);
    p.copy_((torch::sin(t * 0.7 + k) * 0.3 + (k % 4 == 2 ? 1.0 : 0.0)).reshape(p.sizes()));
    ++k;
  }
}

struct NetImpl : torch::nn::Module {
  NetImpl() {
    features = register_module(
        "features",
        torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)),
                              torch::nn::BatchNorm2d(4), torch::nn::ReLU()));
    // momentum unset: the cumulative average of the batch statistics.
    head = register_module(
        "head", torch::nn::Sequential(
                    torch::nn::Linear(64, 6),
                    torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(6).momentum(c10::nullopt)),
                    torch::nn::ReLU(), torch::nn::Linear(6, 2)));
    init_deterministic(*this);
  }
  torch::Tensor forward(torch::Tensor x) { return head->forward(features->forward(x).flatten(1)); }
  torch::nn::Sequential features{nullptr}, head{nullptr};
};
TORCH_MODULE(Net);

// The global batch of a step, identical on every rank and in sync_bn_ref.py.
std::pair<torch::Tensor, torch::Tensor> global_batch(int step) {
  auto rows = torch::arange(kBatch).to(torch::kFloat).reshape({kBatch, 1, 1, 1});
  auto x = torch::sin(torch::arange(kBatch * 3 * 16).to(torch::kFloat).reshape({kBatch, 3, 4, 4}) *
                          0.37 +
                      step * 1.3) *
               (1 + 0.5 * torch::cos(rows)) +
           0.2 * rows;
  auto y =
      torch::cos(torch::arange(kBatch * 2).to(torch::kFloat).reshape({kBatch, 2}) * 0.23 + step);
  return {x, y};
}

// Rows [first, first + count) of the global batch per rank.
std::pair<int64_t, int64_t> slice_of(const std::string& split, int rank) {
  static const std::map<std::string, std::vector<int64_t>> kCounts{
      {"even", {4, 4}}, {"uneven", {6, 2}}, {"empty", {8, 0}}};
  const auto& counts = kCounts.at(split);
  int64_t first = 0;
  for (int r = 0; r < rank; ++r) first += counts[r];
  return {first, counts[rank]};
}

std::string json_values(const torch::Tensor& t) {
  auto v = t.detach().to(torch::kDouble).reshape({-1}).contiguous();
  std::ostringstream s;
  s.precision(9);
  s << "[";
  for (int64_t i = 0; i < v.numel(); ++i) s << (i ? "," : "") << v.data_ptr<double>()[i];
  s << "]";
  return s.str();
}

std::string json_named(const torch::OrderedDict<std::string, torch::Tensor>& items) {
  std::ostringstream s;
  s << "{";
  bool first = true;
  for (const auto& item : items) {
    s << (first ? "" : ", ") << "\"" << item.key() << "\": " << json_values(item.value());
    first = false;
  }
  s << "}";
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::record([&] {
    auto args = sdk_tool::parse_args(
        argc, argv, {{"--split", "even"}, {"--loss", "scaled"}, {"--steps", "4"}, {"--out", "."}});
    const int steps = std::stoi(args["--steps"]);

    ddprun::InitOptions io;
    io.backend = ddprun::Backend::kGloo;
    auto pg = ddprun::init_process_group(io);
    const int rank = pg->rank(), world = pg->size();
    const auto [first, count] = slice_of(args["--split"], rank);

    Net net;
    const auto converted = ddprun::convert_sync_batchnorm(*net, pg);
    ddprun::DistributedDataParallel ddp(net, pg);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    std::vector<std::string> outputs;
    for (int step = 0; step < steps; ++step) {
      opt.zero_grad();
      auto [x, y] = global_batch(step);
      auto out = ddp(x.narrow(0, first, count));
      auto err = (out - y.narrow(0, first, count)).square();
      // DDP averages the ranks' gradients. "scaled": each rank's sum times world / (global
      // element count), so the average is the gradient of the global mean for any split.
      // "mean": the usual per-rank mean (see sync_bn_ref.py for the weighting it equals).
      auto loss = args["--loss"] == "mean"
                      ? err.mean()
                      : err.sum() * (static_cast<double>(world) / static_cast<double>(kBatch * 2));
      loss.backward();
      opt.step();
      outputs.push_back(json_values(out));
    }
    net->eval();
    torch::Tensor eval_out;
    {
      torch::NoGradGuard no_grad;
      eval_out = net->forward(global_batch(steps).first);
    }

    std::ostringstream json;
    json << "{\"rows\": [" << first << ", " << count << "], \"converted\": [";
    for (size_t i = 0; i < converted.size(); ++i) {
      json << (i ? ", " : "") << "\"" << converted[i] << "\"";
    }
    json << "], \"params\": " << json_named(net->named_parameters())
         << ", \"buffers\": " << json_named(net->named_buffers()) << ", \"outputs\": [";
    for (size_t i = 0; i < outputs.size(); ++i) json << (i ? ", " : "") << outputs[i];
    json << "], \"eval_output\": " << json_values(eval_out) << "}\n";
    std::ofstream(args["--out"] + "/cpp_rank" + std::to_string(rank) + ".json") << json.str();
    return 0;
  });
}
