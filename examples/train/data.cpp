#include "examples/train/data.hpp"

#include <ATen/CPUGeneratorImpl.h>

namespace train {

Dataset make_dataset(uint64_t seed, int64_t size, int64_t features, int64_t classes) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed * 7919 + 17);
  torch::NoGradGuard no_grad;
  Dataset d;
  d.features = at::randn({size, features}, gen);
  at::Tensor teacher = at::randn({features, classes}, gen);
  at::Tensor noise = at::randn({size, classes}, gen);
  d.labels = (d.features.matmul(teacher) + 0.5 * noise).argmax(1);
  return d;
}

BatchStream::BatchStream(const Dataset& data, int world, int rank, uint64_t seed,
                         int64_t local_batch)
    : sampler_(data.size(), world, rank, ddprun::SamplerOptions{true, seed, false}),
      local_batch_(local_batch) {}

std::vector<int64_t> BatchStream::indices(int64_t step) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(local_batch_));
  const int64_t per_epoch = sampler_.num_samples();
  for (int64_t pos = step * local_batch_; pos < (step + 1) * local_batch_; ++pos) {
    const int64_t epoch = pos / per_epoch;
    if (epoch != cached_epoch_) {
      sampler_.set_epoch(epoch);
      epoch_indices_ = sampler_.indices();
      cached_epoch_ = epoch;
    }
    out.push_back(epoch_indices_[static_cast<size_t>(pos % per_epoch)]);
  }
  return out;
}

}  // namespace train
