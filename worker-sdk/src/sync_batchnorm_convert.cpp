// convert_sync_batchnorm (ddprun/sync_batchnorm.hpp): every BatchNorm below a module's root
// swapped for a SyncBatchNorm that adopts its tensors, in the containers that hold it.
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "batch_norm_parts.hpp"
#include "ddprun/sync_batchnorm.hpp"

namespace ddprun {
namespace {

template <typename Impl>
std::optional<BatchNormParts> parts_if(const torch::nn::Module& m) {
  const auto* bn = dynamic_cast<const Impl*>(&m);
  if (bn == nullptr) return std::nullopt;
  return BatchNormParts{bn->options,      bn->weight,      bn->bias,
                        bn->running_mean, bn->running_var, bn->num_batches_tracked,
                        bn->is_training()};
}

}  // namespace

std::optional<BatchNormParts> batch_norm_parts(const torch::nn::Module& m) {
  if (auto p = parts_if<torch::nn::BatchNorm1dImpl>(m)) return p;
  if (auto p = parts_if<torch::nn::BatchNorm2dImpl>(m)) return p;
  return parts_if<torch::nn::BatchNorm3dImpl>(m);
}

std::shared_ptr<ProcessGroup> checked_group(std::shared_ptr<ProcessGroup> group) {
  if (!group) throw Error("SyncBatchNorm: the process group is null");
  return group;
}

namespace {

// A BatchNorm found below the root, and where it sits.
struct Found {
  torch::nn::Module* parent;
  std::string name;  // its name in `parent`
  std::string path;  // its path from the root
  std::shared_ptr<torch::nn::Module> module;
};

bool is_container(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::SequentialImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::ModuleListImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&m) != nullptr;
}

void find_batch_norms(torch::nn::Module& parent, const std::string& prefix,
                      std::vector<Found>& found) {
  for (const auto& item : parent.named_children()) {
    const std::string path = prefix.empty() ? item.key() : prefix + "." + item.key();
    if (batch_norm_parts(*item.value())) {
      found.push_back({&parent, item.key(), path, item.value()});
    } else {
      find_batch_norms(*item.value(), path, found);
    }
  }
}

// Swaps `old` for `sync` in the container's own list (what its forward() and operator[] read)
// and in its registered children (what parameters(), to() and state dicts read).
void replace_in_container(torch::nn::Module& parent, const std::string& name,
                          const std::shared_ptr<torch::nn::Module>& old,
                          const SyncBatchNorm& sync) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
    for (auto& any : *seq) {
      if (any.ptr() == old) any = torch::nn::AnyModule(sync);
    }
  } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
    for (auto& m : *list) {
      if (m == old) m = sync.ptr();
    }
  } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
    // update() replaces the entry and the registration together.
    dict->update(std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{
        {name, sync.ptr()}});
    return;
  }
  parent.replace_module(name, sync.ptr());
}

}  // namespace

std::vector<std::string> convert_sync_batchnorm(torch::nn::Module& module,
                                                const std::shared_ptr<ProcessGroup>& group) {
  if (batch_norm_parts(module)) {
    throw Error(
        "convert_sync_batchnorm: the module itself is a BatchNorm; construct "
        "ddprun::SyncBatchNorm(*batch_norm, group) in its place instead");
  }
  checked_group(group);
  std::vector<Found> found;
  find_batch_norms(module, "", found);
  // Refuse before changing anything: a partly converted model would train differently from
  // what either the caller or the error message says.
  std::string refused;
  for (const auto& f : found) {
    if (!is_container(*f.parent)) {
      refused += (refused.empty() ? "" : ", ") + f.path + " (in " + f.parent->name() + ")";
    }
  }
  if (!refused.empty()) {
    throw Error("convert_sync_batchnorm: cannot replace " + refused +
                ": a module of your own calls its typed BatchNorm member in forward(), which "
                "would keep running the old layer; declare that member as ddprun::SyncBatchNorm "
                "instead (nothing was converted)");
  }
  // One SyncBatchNorm per BatchNorm, so a layer shared by two containers stays shared.
  std::map<torch::nn::Module*, SyncBatchNorm> converted;
  std::vector<std::string> paths;
  for (const auto& f : found) {
    auto it = converted.find(f.module.get());
    if (it == converted.end()) {
      it = converted.emplace(f.module.get(), SyncBatchNorm(*f.module, group)).first;
    }
    replace_in_container(*f.parent, f.name, f.module, it->second);
    paths.push_back(f.path);
  }
  return paths;
}

}  // namespace ddprun
