// Test tool: a few SGD steps of DDP on a small deterministic model, mirrored line for line by
// ddp_equiv_ref.py with PyTorch's DistributedDataParallel, so test_ddp_equivalence.py can
// compare the final parameters, the .grad state and the bucket layout.
//
//   ddp_equiv --mode default|find_unused|static --model branch|frozen|order
//             --pattern steps|rank|always --steps N --out DIR [--hook none|allreduce|fp16|bf16]
//
// --hook registers the built-in communication hook of that name (test_comm_hooks.py).
//
// Writes DIR/cpp_rank<R>.json: {"params": {name: [...]}, "grad_none": [names],
// "buckets": [[index, ...], ...], "ready_order": [...], "initial_buckets": [[...], ...]}.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "ddprun/ddp.hpp"
#include "tool_util.hpp"

namespace {

// "branch": an extra head taken on some steps/ranks only, and one never used.
// "frozen": a frozen head (requires_grad false) and a dead one (no gradient: run under no_grad).
// "order": registered in an order unlike the order of use; rank 1 runs its two heads in the
//          other order, so ready orders differ between ranks.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(const std::string& kind) : kind(kind) {
    if (kind == "order") {
      a = register_module("a", torch::nn::Linear(16, 4));
      b = register_module("b", torch::nn::Linear(16, 4));
      body = register_module("body", torch::nn::Linear(6, 16));
    } else {
      fc1 = register_module("fc1", torch::nn::Linear(6, 8));
      fc2 = register_module("fc2", torch::nn::Linear(8, 4));
      extra = register_module("extra", torch::nn::Linear(8, 4));
      never = register_module("never", torch::nn::Linear(3, 3));
    }
    sdk_tool::init_deterministic(*this);
    if (kind == "frozen") {
      for (auto& p : extra->parameters()) p.set_requires_grad(false);
    }
  }
  torch::Tensor forward(torch::Tensor x, bool use_branch, int rank) {
    if (kind == "order") {
      auto h = torch::tanh(body(x));
      if (rank == 1) {
        auto yb = b(h);
        return a(h) + yb;
      }
      auto ya = a(h);
      return ya + b(h);
    }
    auto h = torch::tanh(fc1(x));
    auto out = fc2(h);
    if (kind == "frozen") {
      out = out + extra(h);  // frozen: requires_grad false, excluded from DDP
      torch::Tensor dead;
      {
        torch::NoGradGuard no_grad;  // "never" gets no gradient: not part of the graph
        dead = never(h.narrow(1, 0, 3)).sum(1, true);
      }
      return out + dead;
    }
    if (use_branch) out = out + extra(h);
    return out;
  }
  std::string kind;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, extra{nullptr}, never{nullptr};
  torch::nn::Linear a{nullptr}, b{nullptr}, body{nullptr};
};
TORCH_MODULE(Net);

std::string json_buckets(const std::vector<ddprun::BucketInfo>& buckets) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < buckets.size(); ++i)
    s << (i ? "," : "") << sdk_tool::json_list(buckets[i].parameters);
  s << "]";
  return s.str();
}

// --hook none|allreduce|fp16|bf16 on `ddp`.
template <typename Ddp>
void register_hook(Ddp& ddp, const std::string& hook,
                   const std::shared_ptr<ddprun::ProcessGroup>& pg) {
  if (hook == "allreduce") {
    ddp.register_comm_hook(ddprun::hooks::allreduce(pg));
  } else if (hook == "fp16") {
    ddp.register_comm_hook(ddprun::hooks::fp16_compress(pg));
  } else if (hook == "bf16") {
    ddp.register_comm_hook(ddprun::hooks::bf16_compress(pg));
  } else if (hook != "none") {
    throw ddprun::Error("ddp_equiv: --hook none|allreduce|fp16|bf16, got " + hook);
  }
}

// `"params": {name: [values]}, "grad_none": [names of parameters without a gradient]`, after
// an opening brace.
std::string params_and_grad_none(Net& net) {
  std::ostringstream out;
  out.precision(9);
  out << "{\"params\": {";
  std::ostringstream none;
  bool first = true;
  for (const auto& item : net->named_parameters()) {
    auto v = item.value().detach().reshape({-1});
    out << (first ? "" : ", ") << "\"" << item.key() << "\": [";
    for (int64_t i = 0; i < v.numel(); ++i) out << (i ? "," : "") << v[i].item<float>();
    out << "]";
    if (!item.value().grad().defined()) {
      none << (none.tellp() > 0 ? ", " : "") << "\"" << item.key() << "\"";
    }
    first = false;
  }
  out << "}, \"grad_none\": [" << none.str() << "]";
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::record([&] {
    auto args = sdk_tool::parse_args(argc, argv,
                                     {{"--mode", "default"},
                                      {"--model", "branch"},
                                      {"--pattern", "always"},
                                      {"--steps", "6"},
                                      {"--hook", "none"}});
    const std::string mode = args["--mode"], pattern = args["--pattern"];
    const int steps = std::stoi(args["--steps"]);

    ddprun::InitOptions io;
    io.backend = ddprun::Backend::kGloo;
    auto pg = ddprun::init_process_group(io);
    const int rank = pg->rank();
    Net net(args["--model"]);
    ddprun::DdpOptions o;
    o.find_unused_parameters = mode == "find_unused";
    o.static_graph = mode == "static";
    if (args["--model"] == "order") o.first_bucket_cap_bytes = 512;  // two buckets
    ddprun::DistributedDataParallel ddp(net, pg, o);
    register_hook(ddp, args["--hook"], pg);
    const std::string initial = json_buckets(ddp.buckets());
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < steps; ++step) {
      for (auto& p : net->parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
      auto base = torch::arange(8 * 6).to(torch::kFloat).reshape({8, 6});
      auto x = torch::sin(base * 0.37 + static_cast<float>(step * 7 + rank * 3));
      auto y = torch::cos(torch::arange(8 * 4).to(torch::kFloat).reshape({8, 4}) * 0.23 +
                          static_cast<float>(step + rank));
      const bool use = pattern == "always" || (pattern == "rank" && rank == 1) ||
                       (pattern == "steps" && (step + rank) % 3 == 0);
      torch::mse_loss(ddp(x, use, rank), y).backward();
      opt.step();
    }

    std::ostringstream out;
    out << params_and_grad_none(net) << ", \"buckets\": " << json_buckets(ddp.buckets())
        << ", \"initial_buckets\": " << initial
        << ", \"ready_order\": " << sdk_tool::json_list(ddp.grad_ready_order())
        << ", \"rebuilt\": " << (ddp.buckets_rebuilt() ? "true" : "false") << "}\n";
    std::ofstream(args["--out"] + "/cpp_rank" + std::to_string(rank) + ".json") << out.str();
    pg->barrier();
    return 0;
  });
}
