// Test tool: DDP under a Join with uneven inputs, mirrored line for line by join_ref.py with
// PyTorch's DistributedDataParallel.join(), so test_join.py can compare final parameters and
// buffers on every rank.
//
//   join_worker --batches B0,B1 [--divide-initial 1|0] [--find-unused 0|1] [--throw-early 0|1]
//               [--hook none|allreduce] [--no-sync-every K] [--zero-grad last|first] --out DIR
//
// Rank r trains on B_r batches. Writes DIR/cpp_rank<R>.json: {"params": {name: [...]},
// "buffers": {name: [...]}, "grads": {name: [...] or null}, "steps": B_r}; with --throw-early,
// {"error": message} when the Join threw. --zero-grad first clears gradients before each
// backward instead of after each step, so every rank's .grad ends as its last averaged one.
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ddprun/ddp.hpp"
#include "tool_util.hpp"

namespace {

// A BatchNorm (buffers: running statistics) between two layers, and an extra head used on some
// steps only (for find_unused_parameters).
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 8));
    bn = register_module("bn", torch::nn::BatchNorm1d(8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 4));
    extra = register_module("extra", torch::nn::Linear(8, 4));
    sdk_tool::init_deterministic(*this);
  }
  torch::Tensor forward(torch::Tensor x, bool use_extra) {
    auto h = torch::tanh(bn(fc1(x)));
    auto out = fc2(h);
    if (use_extra) out = out + extra(h);
    return out;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, extra{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

std::string json_tensors(const torch::OrderedDict<std::string, torch::Tensor>& items) {
  std::ostringstream out;
  out.precision(9);
  out << "{";
  bool first = true;
  for (const auto& item : items) {
    auto v = item.value().detach().to(torch::kDouble).reshape({-1});
    out << (first ? "" : ", ") << "\"" << item.key() << "\": [";
    for (int64_t i = 0; i < v.numel(); ++i) out << (i ? "," : "") << v[i].item<double>();
    out << "]";
    first = false;
  }
  out << "}";
  return out.str();
}

std::string json_grads(const torch::OrderedDict<std::string, torch::Tensor>& params) {
  torch::OrderedDict<std::string, torch::Tensor> defined;
  std::string nulls;
  for (const auto& item : params) {
    if (item.value().grad().defined()) {
      defined.insert(item.key(), item.value().grad());
    } else {
      nulls += ", \"" + item.key() + "\": null";
    }
  }
  std::string out = json_tensors(defined);
  if (nulls.empty()) return out;
  return out.size() == 2 ? "{" + nulls.substr(2) + "}"
                         : out.substr(0, out.size() - 1) + nulls + "}";
}

// The seeded (x, y) of one step on one rank (join_ref.py makes the same).
std::pair<torch::Tensor, torch::Tensor> batch(int step, int rank) {
  auto base = torch::arange(8 * 6).to(torch::kFloat).reshape({8, 6});
  auto x = torch::sin(base * 0.37 + static_cast<float>(step * 7 + rank * 3));
  auto y = torch::cos(torch::arange(8 * 4).to(torch::kFloat).reshape({8, 4}) * 0.23 +
                      static_cast<float>(step + rank));
  return {x, y};
}

// What the rank writes: the error it got, or its parameters, buffers, gradients and steps.
std::string report(const std::string& error, Net& net, int steps) {
  std::ostringstream out;
  if (!error.empty()) {
    std::string quoted;
    for (char c : error)
      quoted += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    out << "{\"error\": \"" << quoted << "\"}\n";
  } else {
    out << "{\"params\": " << json_tensors(net->named_parameters())
        << ", \"buffers\": " << json_tensors(net->named_buffers())
        << ", \"grads\": " << json_grads(net->named_parameters()) << ", \"steps\": " << steps
        << "}\n";
  }
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::record([&] {
    auto args = sdk_tool::parse_args(argc, argv,
                                     {{"--divide-initial", "1"},
                                      {"--find-unused", "0"},
                                      {"--throw-early", "0"},
                                      {"--hook", "none"},
                                      {"--no-sync-every", "0"},
                                      {"--zero-grad", "last"}});
    ddprun::InitOptions io;
    io.backend = ddprun::Backend::kGloo;
    auto pg = ddprun::init_process_group(io);
    const int rank = pg->rank();
    std::vector<int> batches;
    std::istringstream list(args["--batches"]);
    for (std::string b; std::getline(list, b, ',');) batches.push_back(std::stoi(b));
    const int mine = batches.at(static_cast<size_t>(rank));
    const int no_sync_every = std::stoi(args["--no-sync-every"]);
    const bool find_unused = args["--find-unused"] == "1";
    const bool zero_first = args["--zero-grad"] == "first";

    Net net;
    ddprun::DdpOptions o;
    o.find_unused_parameters = find_unused;
    ddprun::DistributedDataParallel ddp(net, pg, o);
    if (args["--hook"] == "allreduce") ddp.register_comm_hook(ddprun::hooks::allreduce(pg));
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    ddprun::JoinOptions jo;
    jo.divide_by_initial_world_size = args["--divide-initial"] == "1";
    jo.throw_on_early_termination = args["--throw-early"] == "1";

    std::string error;
    try {
      ddprun::join(
          {&ddp},
          [&] {
            for (int step = 0; step < mine; ++step) {
              auto [x, y] = batch(step, rank);
              const bool use_extra = !find_unused || (step + rank) % 3 == 0;
              if (no_sync_every > 0 && step % no_sync_every == 0) {
                auto guard = ddp.no_sync();  // accumulates; the next step reduces the sum
                torch::mse_loss(ddp(x, use_extra), y).backward();
                continue;
              }
              if (zero_first) opt.zero_grad();
              torch::mse_loss(ddp(x, use_extra), y).backward();
              opt.step();
              if (!zero_first) opt.zero_grad();
            }
          },
          jo);
    } catch (const ddprun::Error& e) {
      if (!jo.throw_on_early_termination) throw;
      error = e.what();
    }

    std::ofstream(args["--out"] + "/cpp_rank" + std::to_string(rank) + ".json")
        << report(error, net, mine);
    if (error.empty()) pg->barrier();
    return 0;
  });
}
