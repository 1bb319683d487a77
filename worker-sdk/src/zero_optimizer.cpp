#include "ddprun/zero_optimizer.hpp"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <numeric>
#include <sstream>
#include <type_traits>

#include "ddprun/env.hpp"

namespace ddprun {
namespace {

// The key of a parameter in Optimizer::state(): its TensorImpl's address, as text in LibTorch
// 1.x and as the pointer itself in 2.x.
template <typename StateMap>
typename StateMap::key_type state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    return c10::str(p.unsafeGetTensorImpl());
  } else {
    return p.unsafeGetTensorImpl();
  }
}

int64_t bytes_of(std::initializer_list<at::Tensor> tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) {
    if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return n;
}

int64_t state_bytes(const torch::optim::OptimizerParamState& s) {
  namespace o = torch::optim;
  if (auto* sgd = dynamic_cast<const o::SGDParamState*>(&s))
    return bytes_of({sgd->momentum_buffer()});
  if (auto* a = dynamic_cast<const o::AdamParamState*>(&s)) {
    return bytes_of({a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()});
  }
  if (auto* a = dynamic_cast<const o::AdamWParamState*>(&s)) {
    return bytes_of({a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()});
  }
  if (auto* a = dynamic_cast<const o::AdagradParamState*>(&s)) return bytes_of({a->sum()});
  if (auto* r = dynamic_cast<const o::RMSpropParamState*>(&s)) {
    return bytes_of({r->square_avg(), r->momentum_buffer(), r->grad_avg()});
  }
  throw Error("optimizer_state_bytes: unknown optimizer state type " +
              std::string(typeid(s).name()));
}

std::string archive_bytes(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

}  // namespace

std::vector<std::vector<size_t>> partition_parameters(const std::vector<int64_t>& numels,
                                                      int world) {
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return numels[a] > numels[b]; });
  std::vector<std::vector<size_t>> shards(static_cast<size_t>(world));
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  for (size_t i : order) {
    // The first rank of least load, as Python's values.index(min(values)).
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    shards[r].push_back(i);
    load[r] += numels[i];
  }
  return shards;
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t n = 0;
  for (const auto& [key, state] : optimizer.state()) n += state_bytes(*state);
  return n;
}

// The parameters of one owner rank, dtype and device, flattened for one broadcast.
struct ZeroRedundancyOptimizer::Bucket {
  int owner = 0;
  std::vector<size_t> params;  // indices into all_
  int64_t numel = 0;
  at::TensorOptions options;
  at::Tensor flat;  // persistent with parameters_as_bucket_view, else per step
};

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<torch::Tensor> parameters,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 OptimizerFactory make_optimizer,
                                                 ZeroOptions options)
    : Optimizer(std::vector<torch::optim::OptimizerParamGroup>{}, nullptr),
      group_(std::move(group)),
      make_optimizer_(std::move(make_optimizer)),
      options_(options),
      all_(std::move(parameters)) {
  if (all_.empty()) throw Error("ZeroRedundancyOptimizer: no parameters");
  std::vector<int64_t> numels;
  for (const auto& p : all_) {
    if (p.is_sparse()) throw Error("ZeroRedundancyOptimizer: sparse parameters are not supported");
    numels.push_back(p.numel());
  }
  partition_ = partition_parameters(numels, group_->size());
  owners_.assign(all_.size(), 0);
  for (size_t r = 0; r < partition_.size(); ++r) {
    for (size_t i : partition_[r]) owners_[i] = static_cast<int>(r);
  }

  std::vector<torch::Tensor> mine;
  for (size_t i : partition_[static_cast<size_t>(group_->rank())]) mine.push_back(all_[i]);
  local_ = make_optimizer_(std::move(mine));
  if (!local_ || local_->param_groups().size() != 1) {
    throw Error(
        "ZeroRedundancyOptimizer: the optimizer factory must return an optimizer with "
        "exactly one parameter group");
  }
  defaults_ = local_->defaults().clone();
  add_param_group(
      torch::optim::OptimizerParamGroup(all_, local_->param_groups()[0].options().clone()));

  // Buckets: per owner, per dtype and device in order of first appearance.
  for (size_t r = 0; r < partition_.size(); ++r) {
    const size_t first = buckets_.size();
    for (size_t i : partition_[r]) {
      const auto& p = all_[i];
      auto it =
          std::find_if(buckets_.begin() + static_cast<std::ptrdiff_t>(first), buckets_.end(),
                       [&](const Bucket& b) {
                         return b.options.dtype() == p.dtype() && b.options.device() == p.device();
                       });
      if (it == buckets_.end()) {
        buckets_.push_back(Bucket{static_cast<int>(r), {}, 0, p.options(), {}});
        it = buckets_.end() - 1;
      }
      it->params.push_back(i);
      it->numel += p.numel();
    }
  }
  if (options_.parameters_as_bucket_view) {
    torch::NoGradGuard no_grad;
    for (auto& b : buckets_) {
      b.flat = at::empty({b.numel}, b.options);
      int64_t offset = 0;
      for (size_t i : b.params) {
        auto& p = all_[i];
        auto view = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
        view.copy_(p.detach());
        p.set_data(view);
        offset += p.numel();
      }
    }
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

torch::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  // Options changed on this optimizer (a scheduler's learning rate) apply to the local one.
  local_->param_groups()[0].set_options(param_groups_[0].options().clone());
  torch::Tensor loss = local_->step(std::move(closure));
  broadcast_parameters();
  return loss;
}

void ZeroRedundancyOptimizer::broadcast_parameters() {
  torch::NoGradGuard no_grad;
  const int rank = group_->rank();
  std::vector<Work> works;
  works.reserve(buckets_.size());
  for (auto& b : buckets_) {
    if (!options_.parameters_as_bucket_view) {
      if (b.owner == rank) {
        std::vector<at::Tensor> flat;
        for (size_t i : b.params) flat.push_back(all_[i].detach().reshape({-1}));
        b.flat = at::cat(flat);
      } else {
        b.flat = at::empty({b.numel}, b.options);
      }
    }
    works.push_back(group_->broadcast_async(b.flat, b.owner));
  }
  for (auto& w : works) w.wait();
  for (auto& b : buckets_) {
    if (options_.parameters_as_bucket_view) continue;  // the parameters are the buffer
    if (b.owner != rank) {
      int64_t offset = 0;
      for (size_t i : b.params) {
        auto& p = all_[i];
        p.detach().copy_(b.flat.narrow(0, offset, p.numel()).view(p.sizes()));
        offset += p.numel();
      }
    }
    b.flat = at::Tensor();  // a full copy of the model would otherwise stay allocated
  }
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  for (auto& p : all_) {
    if (!p.mutable_grad().defined()) continue;
    p.mutable_grad().detach_();
    if (set_to_none) {
      p.mutable_grad().reset();
    } else {
      p.mutable_grad().zero_();
    }
  }
}

int64_t ZeroRedundancyOptimizer::local_state_bytes() const {
  return optimizer_state_bytes(*local_);
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  local_->param_groups()[0].set_options(param_groups_[0].options().clone());
  consolidated_ = group_->gather_bytes(archive_bytes(*local_), to);
}

std::unique_ptr<torch::optim::Optimizer> ZeroRedundancyOptimizer::unsharded() const {
  auto full = make_optimizer_(all_);
  full->param_groups()[0].set_options(param_groups_[0].options().clone());
  return full;
}

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive& archive) const {
  if (consolidated_.empty()) {
    throw Error(
        "ZeroRedundancyOptimizer::save: the optimizer state has not been consolidated "
        "on rank " +
        std::to_string(group_->rank()) + ": call consolidate_state_dict(" +
        std::to_string(group_->rank()) + ") on every rank first");
  }
  // Each rank's archive is loaded into an optimizer over that rank's shard (LibTorch maps saved
  // state to parameters by position); its entries are then keyed by the same parameters as the
  // unsharded optimizer's.
  auto full = unsharded();
  for (size_t r = 0; r < consolidated_.size(); ++r) {
    std::vector<torch::Tensor> shard;
    for (size_t i : partition_[r]) shard.push_back(all_[i]);
    auto part = make_optimizer_(std::move(shard));
    torch::serialize::InputArchive in;
    in.load_from(consolidated_[r].data(), consolidated_[r].size(), torch::kCPU);
    part->load(in);
    for (auto& [key, state] : part->state()) full->state()[key] = std::move(state);
  }
  full->save(archive);
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive& archive) {
  auto full = unsharded();
  full->load(archive);
  auto& source = full->state();
  auto& target = local_->state();
  target.clear();
  for (const auto& p : local_->param_groups()[0].params()) {
    auto it = source.find(state_key<std::decay_t<decltype(source)>>(p));
    if (it != source.end()) target[it->first] = std::move(it->second);
  }
  // 2.x's load() restores the group's options (1.x keeps the constructed ones): as it did.
  param_groups_[0].set_options(full->param_groups()[0].options().clone());
  local_->param_groups()[0].set_options(full->param_groups()[0].options().clone());
}

}  // namespace ddprun
