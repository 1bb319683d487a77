// The training state (model, optimizer, progress) as bytes: the checkpoint file's format, also
// what a survivor hands a replacement in an in-process recovery. Internal.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "ddprun/checkpoint.hpp"

namespace ddprun::detail {

std::string serialize_training_state(const TrainingProgress& progress,
                                     const torch::nn::Module& model,
                                     const torch::optim::Optimizer& optimizer);

// Restores `model` in place (its tensors keep their storage) and `optimizer` from `bytes`,
// tensors onto `device`. Throws ddprun::Error when a parameter's shape differs, c10::Error or
// std::exception when the bytes are not such a state.
TrainingProgress restore_training_state(const char* bytes, size_t size, c10::Device device,
                                        torch::nn::Module& model,
                                        torch::optim::Optimizer& optimizer);

}  // namespace ddprun::detail
