#include "ddprun/sampler.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <string>

#include "ddprun/env.hpp"

namespace ddprun {

DistributedSampler::DistributedSampler(int64_t dataset_size, int world, int rank,
                                       SamplerOptions options)
    : size_(dataset_size), world_(world), rank_(rank), options_(options) {
  if (world < 1) throw Error("DistributedSampler: world size " + std::to_string(world) + " < 1");
  if (rank < 0 || rank >= world) {
    throw Error("DistributedSampler: rank " + std::to_string(rank) + " is not in [0, " +
                std::to_string(world) + ")");
  }
  if (dataset_size < 0) throw Error("DistributedSampler: negative dataset size");
  // Python: ceil((len - world) / world) with drop_last and an uneven split, else ceil(len / world).
  if (options_.drop_last && size_ % world_ != 0) {
    const int64_t n = size_ - world_;
    num_samples_ = n <= 0 ? 0 : (n + world_ - 1) / world_;
  } else {
    num_samples_ = (size_ + world_ - 1) / world_;
  }
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  all.reserve(static_cast<size_t>(std::max(size_, total_size())));
  if (options_.shuffle) {
    // Same generator (mt19937 behind CPUGeneratorImpl) and seed as torch.Generator().manual_seed.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed + epoch_);
    at::Tensor perm = at::randperm(size_, gen, at::TensorOptions().dtype(at::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    all.assign(p, p + size_);
  } else {
    for (int64_t i = 0; i < size_; ++i) all.push_back(i);
  }
  const int64_t total = total_size();
  if (!options_.drop_last) {
    // Pad by repeating the head of the list (the list itself, as often as needed).
    for (int64_t i = 0; static_cast<int64_t>(all.size()) < total && size_ > 0; ++i) {
      all.push_back(all[static_cast<size_t>(i % size_)]);
    }
  } else {
    all.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total; i += world_) mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace ddprun
