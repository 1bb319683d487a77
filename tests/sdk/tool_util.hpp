// What the SDK's C++ test tools (ddp_equiv, join_worker, zero_worker, sync_bn_worker,
// powersgd_worker) share with each other; their Python twins share reftool.py.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace sdk_tool {

// Weights from a formula, not an RNG, so that the C++ tool and its Python twin start identically
// (reftool.init_deterministic is the same formula).
inline void init_deterministic(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  int k = 0;
  for (auto& p : m.parameters()) {
    auto t = torch::arange(p.numel()).to(torch::kFloat);
    p.copy_((torch::sin(t * 0.7 + k) * 0.3).reshape(p.sizes()));
    ++k;
  }
}

// FNV-1a over the bytes of every parameter: equal hashes mean bitwise equal models.
inline uint64_t params_hash(torch::nn::Module& m) {
  uint64_t hash = 1469598103934665603ULL;
  for (const auto& p : m.parameters()) {
    auto t = p.detach().contiguous();
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
    for (size_t i = 0; i < n; ++i) hash = (hash ^ bytes[i]) * 1099511628211ULL;
  }
  return hash;
}

// "--flag value" pairs over `defaults`.
inline std::map<std::string, std::string> parse_args(int argc, char** argv,
                                                     std::map<std::string, std::string> defaults) {
  for (int i = 1; i + 1 < argc; i += 2) defaults[argv[i]] = argv[i + 1];
  return defaults;
}

template <typename T>
std::string json_list(const std::vector<T>& v) {
  std::ostringstream s;
  s.precision(9);
  s << "[";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  s << "]";
  return s.str();
}

}  // namespace sdk_tool
