// What SyncBatchNorm's adopting constructor and convert_sync_batchnorm take from a
// torch::nn::BatchNorm{1,2,3}d (sync_batchnorm.cpp, sync_batchnorm_convert.cpp). Internal.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/options/batchnorm.h>

#include <memory>
#include <optional>

#include "ddprun/process_group.hpp"

namespace ddprun {

struct BatchNormParts {
  torch::nn::BatchNormOptions options;
  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  bool training;
};

// The parts of a BatchNorm1d/2d/3d; nullopt for any other module.
std::optional<BatchNormParts> batch_norm_parts(const torch::nn::Module& m);

// The group, or Error when it is null.
std::shared_ptr<ProcessGroup> checked_group(std::shared_ptr<ProcessGroup> group);

}  // namespace ddprun
