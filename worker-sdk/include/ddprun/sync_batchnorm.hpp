// SyncBatchNorm: batch normalisation whose training statistics span the batches of every rank,
// the C++ counterpart of torch.nn.SyncBatchNorm.
//
//   auto net = torch::nn::Sequential(torch::nn::Conv2d(3, 16, 3), torch::nn::BatchNorm2d(16),
//                                    torch::nn::ReLU());
//   ddprun::convert_sync_batchnorm(*net, pg);   // BatchNorm2d -> SyncBatchNorm, same tensors
//   ddprun::DistributedDataParallel ddp(net, pg);
//
// or, in a module of your own, declare the layer as SyncBatchNorm from the start:
//
//   ddprun::SyncBatchNorm bn{nullptr};
//   bn = register_module("bn", ddprun::SyncBatchNorm(torch::nn::BatchNormOptions(16), pg));
//
// In training mode with more than one rank, the mean and variance of each channel are those of
// the global batch (the concatenation of every rank's input along dim 0; ranks may hold
// different numbers of rows, none included), the running statistics are updated with the global
// unbiased variance, and backward gives each rank the input gradient BatchNorm has over the
// global batch. weight/bias gradients are local sums (DistributedDataParallel averages them).
// Otherwise (eval mode, a group of one) it computes exactly what torch::nn::BatchNorm does.
// Communication: one all_gather per training forward, one all_reduce per backward that needs the
// input gradient, so every rank must run the same forwards and backwards in the same order, as
// with any collective. Works on CPU (Gloo) and CUDA (NCCL) tensors.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "ddprun/process_group.hpp"

namespace ddprun {

// Input (N, C, *) with two or more dimensions: stands for BatchNorm1d, 2d and 3d alike.
// Parameters and buffers are named as torch::nn::BatchNorm's (weight, bias, running_mean,
// running_var, num_batches_tracked), so state dicts and checkpoints interchange.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  // Fresh parameters and statistics, as torch::nn::BatchNorm initialises them. `group` must not
  // be null; the module keeps it alive.
  SyncBatchNormImpl(const torch::nn::BatchNormOptions& options,
                    std::shared_ptr<ProcessGroup> group);
  // Takes over a torch::nn::BatchNorm{1,2,3}d: its options, its train/eval mode and its tensors,
  // shared, not copied (as Python's convert_sync_batchnorm), so an optimizer made before still
  // updates them. Throws ddprun::Error for any other module.
  SyncBatchNormImpl(const torch::nn::Module& batch_norm, std::shared_ptr<ProcessGroup> group);

  at::Tensor forward(const at::Tensor& input);

  void reset() override;
  void reset_running_stats();
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }

  torch::nn::BatchNormOptions options;
  at::Tensor weight;               // undefined unless options.affine()
  at::Tensor bias;                 // undefined unless options.affine()
  at::Tensor running_mean;         // undefined unless options.track_running_stats()
  at::Tensor running_var;          // undefined unless options.track_running_stats()
  at::Tensor num_batches_tracked;  // undefined unless options.track_running_stats()

 private:
  std::shared_ptr<ProcessGroup> group_;
};
TORCH_MODULE(SyncBatchNorm);

// Python's SyncBatchNorm.convert_sync_batchnorm for a C++ module tree: every
// torch::nn::BatchNorm{1,2,3}d below `module` that sits directly in a torch::nn::Sequential,
// ModuleList or ModuleDict is replaced there (in the container's own list, which its forward
// and operator[] use, and in its registered children) by a SyncBatchNorm that takes over its
// tensors (shared), requires_grad and mode. Returns the paths of the replaced submodules
// ("features.1", ...). Call it before wrapping the model in DistributedDataParallel; an
// optimizer built before keeps working (the parameters are the same tensors).
//
// A BatchNorm registered by a module of your own cannot be replaced: that module's forward()
// calls its typed member (torch::nn::BatchNorm2d bn), which would keep running the old layer.
// Then nothing is converted and ddprun::Error names every such submodule; declare those
// members as ddprun::SyncBatchNorm instead. `module` itself being a BatchNorm is an error too
// (construct SyncBatchNorm(*batch_norm, group) instead).
std::vector<std::string> convert_sync_batchnorm(torch::nn::Module& module,
                                                const std::shared_ptr<ProcessGroup>& group);

}  // namespace ddprun
