// A synthetic classification task generated from a seed, identical on every rank (no I/O):
// Gaussian features, labels from a random linear "teacher" with noise, so the task is
// learnable but not trivial.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "ddprun/sampler.hpp"

namespace train {

struct Dataset {
  torch::Tensor features;  // [size, features] float
  torch::Tensor labels;    // [size] int64
  int64_t size() const { return features.size(0); }
};

Dataset make_dataset(uint64_t seed, int64_t size, int64_t features, int64_t classes);

// This rank's sample stream: its DistributedSampler indices, epoch after epoch. The batch of a
// step depends only on (seed, step, world, rank), so a resumed run sees the same data order.
class BatchStream {
 public:
  BatchStream(const Dataset& data, int world, int rank, uint64_t seed, int64_t local_batch);
  // Indices of step `step` (0-based).
  std::vector<int64_t> indices(int64_t step);

 private:
  ddprun::DistributedSampler sampler_;
  int64_t local_batch_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> epoch_indices_;
};

}  // namespace train
