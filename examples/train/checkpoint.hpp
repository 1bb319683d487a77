// Checkpoints of the `train` example: model, optimizer state and the step reached, written by
// rank 0 atomically (temp file, fsync, rename) so a crash never leaves a torn checkpoint.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ddprun/process_group.hpp"

namespace train {

struct CheckpointMeta {
  int64_t step = 0;          // steps completed
  int64_t global_batch = 0;  // must match to resume with the same data order
  int64_t seed = 0;
};

// Rank 0: serializes and atomically replaces <dir>/checkpoint.pt. Returns the path.
std::string save_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                            torch::nn::Module& model, torch::optim::Optimizer& optimizer);

// Collective: rank 0 reads <dir>/checkpoint.pt (if any) and broadcasts it, so every rank
// restores the same state even without a shared file system. Returns nullopt when there is none.
std::optional<CheckpointMeta> load_checkpoint(ddprun::ProcessGroup& pg, const std::string& dir,
                                              torch::nn::Module& model,
                                              torch::optim::Optimizer& optimizer);

}  // namespace train
