// The training state (model, optimizer, progress) as bytes, in two layouts. LibTorch's archive
// (torch::serialize::OutputArchive) is the checkpoint file's format. The raw layout is what
// saves to the job's in-memory checkpoint and a survivor's handoff to a replacement in an
// in-process recovery use: a short header, then each tensor's bytes as they lie in memory, so
// writing it is one copy of the tensors (the archive pickles, zips and checksums them, which
// for a small model costs more than the step). Both are read by restore_training_state.
// Internal: the raw layout is for the processes of one job (same build, same byte order).
#pragma once

#include <sys/uio.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <optional>
#include <string>
#include <vector>

#include "ddprun/checkpoint.hpp"

namespace ddprun::detail {

std::string serialize_training_state(const TrainingProgress& progress,
                                     const torch::nn::Module& model,
                                     const torch::optim::Optimizer& optimizer);

// The raw layout of a state, ready to write: `parts` point into `head`, `blob` and the tensors
// `keep` holds (the model's own where they are dense CPU tensors: write before they change).
// Moving it keeps them valid (both strings are longer than any inline buffer).
struct RawTrainingState {
  std::string head;              // magic, header length, header, padding to the first tensor
  std::vector<at::Tensor> keep;  // the tensors `parts` point into
  std::string blob;              // an optimizer without a raw codec, in LibTorch's archive
  std::vector<struct iovec> parts;
  size_t size = 0;  // of all parts
};

// The raw layout of the state, or nullopt when a tensor in it is not a dense strided one (a
// sparse or quantized tensor: the archive holds those).
std::optional<RawTrainingState> raw_training_state(const TrainingProgress& progress,
                                                   const torch::nn::Module& model,
                                                   const torch::optim::Optimizer& optimizer);

// The state's bytes in the raw layout where it has one, else in LibTorch's archive.
std::string training_state_bytes(const TrainingProgress& progress, const torch::nn::Module& model,
                                 const torch::optim::Optimizer& optimizer);

// Restores `model` in place (its tensors keep their storage) and `optimizer` from `bytes` in
// either layout, tensors onto `device`. Throws ddprun::Error when the model or optimizer does
// not fit the state (naming the parameter), c10::Error or std::exception (not ddprun::Error)
// when the bytes are not such a state.
TrainingProgress restore_training_state(const char* bytes, size_t size, c10::Device device,
                                        torch::nn::Module& model,
                                        torch::optim::Optimizer& optimizer);

}  // namespace ddprun::detail
