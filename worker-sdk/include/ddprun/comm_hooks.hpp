// Communication hooks: how DistributedDataParallel reduces a bucket of gradients, replaceable
// by the user, as with PyTorch's DistributedDataParallel.register_comm_hook.
//
//   ddprun::DistributedDataParallel ddp(net, pg);
//   ddp.register_comm_hook(ddprun::hooks::fp16_compress(pg));        // a built-in hook
//   ddp.register_comm_hook([pg](ddprun::GradBucket& bucket) {        // or your own
//     bucket.buffer().div_(pg->size());
//     return ddprun::TensorFuture::after(pg->all_reduce_async(bucket.buffer()), bucket.buffer());
//   });
//
// A hook gets each bucket once per synchronised backward, as soon as all of the bucket's
// gradients are in it, and returns a TensorFuture of the reduced bucket. The gradients in the
// buffer are this rank's own, NOT divided by the world size (the hook averages, as PyTorch's
// hooks do). When backward ends, DDP waits for every bucket's future and copies its value into
// the parameters' .grad. Every rank must issue the same collectives in the same order: hooks
// are called in bucket order on every rank.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "ddprun/process_group.hpp"

namespace ddprun {

// A tensor that may not be computed yet: a collective in flight, possibly followed by steps to
// run on its result. Steps run on the thread that waits, when it waits (DDP waits for the
// buckets in order when backward ends), so a multi-step hook's later collectives start then.
// Copyable handle; wait() may be called more than once and runs each step once.
class TensorFuture {
 public:
  TensorFuture() = default;
  // Already done.
  static TensorFuture ready(at::Tensor value);
  // Done when `work` is; its value is `result` (the tensor the collective writes into).
  static TensorFuture after(Work work, at::Tensor result);
  // The value of `next(value of this)`.
  TensorFuture then(std::function<at::Tensor(at::Tensor)> next) const;
  at::Tensor wait() const;
  bool valid() const { return state_ != nullptr; }

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// One bucket, as a hook sees it.
class GradBucket {
 public:
  GradBucket(size_t index, bool is_last, at::Tensor buffer, std::vector<at::Tensor> gradients,
             std::vector<at::Tensor> parameters)
      : index_(index),
        is_last_(is_last),
        buffer_(std::move(buffer)),
        gradients_(std::move(gradients)),
        parameters_(std::move(parameters)) {}

  // Position in the launch order (0 first); stable until the buckets are rebuilt.
  size_t index() const { return index_; }
  // The last bucket of the backward pass: a hook with per-iteration state advances on it.
  bool is_last() const { return is_last_; }
  // This rank's gradients, packed into one flat tensor; a hook may work in place on it.
  at::Tensor& buffer() { return buffer_; }
  // Views of buffer(), one per parameter, shaped like it.
  const std::vector<at::Tensor>& gradients() const { return gradients_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }

 private:
  size_t index_;
  bool is_last_;
  at::Tensor buffer_;
  std::vector<at::Tensor> gradients_;
  std::vector<at::Tensor> parameters_;
};

// Returns the bucket's reduced (averaged) gradients: a tensor with buffer()'s number of
// elements (any floating dtype; it is copied into the gradients), or buffer() itself.
using CommHook = std::function<TensorFuture(GradBucket&)>;

namespace hooks {

// Average over the group: PyTorch's allreduce_hook (divide by the world size, then sum).
CommHook allreduce(std::shared_ptr<ProcessGroup> group);
// Cast to float16 (bfloat16), divide by the world size, sum, cast back: PyTorch's
// fp16_compress_hook and bf16_compress_hook. bf16 over Gloo needs LibTorch 2.x.
CommHook fp16_compress(std::shared_ptr<ProcessGroup> group);
CommHook bf16_compress(std::shared_ptr<ProcessGroup> group);

// PowerSGD (Vogels et al., NeurIPS 2019), as PyTorch's powerSGD_hook: each bucket's matrix-shaped
// gradients M (n x m; higher-dimensional ones as n x rest) are approximated by P Q^T of rank
// r = min(n, m, matrix_approximation_rank), and only P (n x r) and Q (m x r) cross the wire;
// vectors (biases) and matrices too small to gain are all-reduced uncompressed, in one flat
// tensor. Per bucket: one all-reduce of the uncompressed tensors and one of all its P's (both
// started when the hook runs), then one of all its Q's (started when DDP waits for the bucket).
//
//   ddprun::hooks::PowerSGDOptions o;
//   o.matrix_approximation_rank = 2;
//   o.start_powerSGD_iter = 10;
//   auto state = std::make_shared<ddprun::hooks::PowerSGDState>(pg, o);
//   ddp.register_comm_hook(ddprun::hooks::powerSGD(state));
//
// Per compressed step and bucket, M (the bucket's gradient plus, with error feedback, last
// step's error) becomes: P = M Q (Q: last step's averaged Q with warm start, else random; made
// orthonormal first); P summed over ranks, orthogonalised (Gram-Schmidt); Q = M^T P summed over
// ranks and divided by the world size; M ~ P Q^T. The error kept for the next step is the input
// minus what the bucket ends up holding (for uncompressed tensors: local minus average), as in
// PyTorch. Every rank draws the same random Q (from random_seed), but not PyTorch's numbers.
struct PowerSGDOptions {
  int matrix_approximation_rank = 1;
  // Plain averaging all-reduce for iterations 0 .. start_powerSGD_iter-1 (the early steps matter
  // most for convergence); must be > 1 with error feedback or warm start, since DDP rebuilds its
  // buckets after iteration 0 and the per-bucket state must not predate that.
  int64_t start_powerSGD_iter = 1000;
  // Compress a matrix only when that saves enough: n*m > (n+m)*r * min_compression_rate.
  double min_compression_rate = 2;
  // Add the previous iteration's compression error to the gradient before compressing.
  bool use_error_feedback = true;
  // Reuse the previous iteration's Q as the starting point (one power iteration per step).
  bool warm_start = true;
  // Added to the column norms in Gram-Schmidt (e.g. 1e-8). With 0 an all-zero column stays zero
  // (PyTorch's would become NaN).
  double orthogonalization_epsilon = 0;
  // Seed of the random initial Q's: every rank draws the same ones.
  uint64_t random_seed = 0;
};

// State of a PowerSGD hook, kept across iterations (error feedback, warm-start Q). Share one
// state per DDP model; inspect it between steps (from the training thread).
struct PowerSGDState {
  // Throws ddprun::Error for a null group or invalid options (see PowerSGDOptions).
  explicit PowerSGDState(std::shared_ptr<ProcessGroup> group, PowerSGDOptions options = {});
  std::shared_ptr<ProcessGroup> group;
  PowerSGDOptions options;
  int64_t iter = 0;  // synchronised backwards seen (advanced on the last bucket)
  std::map<size_t, at::Tensor> error;  // per bucket index: the compression error, flat
  std::map<size_t, at::Tensor> p, q;   // per bucket index: packed P and Q of its matrices
  // Bytes this rank handed to all-reduce through the hook, compressed or not (for benchmarks).
  int64_t bytes_reduced = 0;
  // Elements of the gradients seen in compressed iterations, and of what went on the wire for
  // them (PyTorch's compression_stats: their ratio is the compression rate).
  int64_t numel_before_compression = 0;
  int64_t numel_after_compression = 0;
  uint64_t random_draws = 0;  // random Q's drawn so far (the next seed derives from it)
};

CommHook powerSGD(std::shared_ptr<PowerSGDState> state);

}  // namespace hooks
}  // namespace ddprun
