// DistributedSampler: the indices Python's torch.utils.data.DistributedSampler yields, exactly,
// so C++ and Python workers of one job (and a C++ rewrite of a Python job) see the same data.
//
//   ddprun::DistributedSampler sampler(dataset_size, pg->size(), pg->rank(), {.seed = 7});
//   for (int epoch = 0; ...; ++epoch) {
//     sampler.set_epoch(epoch);
//     for (int64_t i : sampler.indices()) ...
//   }
//
// Algorithm (torch/utils/data/distributed.py): shuffle = randperm(size) from a CPU generator
// seeded with seed + epoch; without drop_last the list is padded by repeating its head up to
// num_samples() * world; with drop_last it is cut to that; rank r takes every world-th index
// from r. Plain value type; not thread-safe for concurrent mutation.
#pragma once

#include <cstdint>
#include <vector>

namespace ddprun {

struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // Throws ddprun::Error when rank is not in [0, world) or world < 1.
  DistributedSampler(int64_t dataset_size, int world, int rank, SamplerOptions options = {});

  // Python's set_epoch: selects the shuffle of this epoch.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // Samples this rank gets per epoch (Python's len(sampler)).
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * world_; }

  // This rank's indices for the current epoch, in order.
  std::vector<int64_t> indices() const;

 private:
  int64_t size_;
  int world_;
  int rank_;
  SamplerOptions options_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

}  // namespace ddprun
