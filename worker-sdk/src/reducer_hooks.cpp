// The parts of the Reducer that hand buckets to a communication hook and that stand in for a
// backward pass on a rank that has joined (Join). The rest: reducer.cpp.
#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "group_recovery.hpp"
#include "reducer.hpp"

namespace ddprun {

void Reducer::set_comm_hook(CommHook hook) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!hook) throw Error("DistributedDataParallel::register_comm_hook: the hook is empty");
  if (comm_hook_) {
    throw Error(
        "DistributedDataParallel::register_comm_hook: a hook is registered already "
        "(one per DistributedDataParallel, as in PyTorch)");
  }
  if (iteration_ > 0 || callback_queued_) {
    throw Error(
        "DistributedDataParallel::register_comm_hook: register the hook before the "
        "first backward pass");
  }
  if (options_.compression != GradCompression::kNone) {
    throw Error(
        "DistributedDataParallel::register_comm_hook: DdpOptions::compression is set; "
        "use hooks::fp16_compress or hooks::bf16_compress instead of both");
  }
  comm_hook_ = std::move(hook);
  scale_ = 1.0;  // hooks average themselves, as PyTorch's do
}

void Reducer::set_divisor(int ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ranks < 1) throw Error("DistributedDataParallel: divisor must be positive");
  if (!comm_hook_) scale_ = 1.0 / ranks;  // hooks average as they choose
}

void Reducer::shadow_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  // The joined rank keeps its own last averaged gradients, as in PyTorch (whose joined rank
  // reduces separate zero tensors): a .grad that lives in a bucket moves out before the bucket
  // is reused for the others' reduction. Only the first shadowed round copies anything.
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& grad = params_[i].mutable_grad();
    const Slot& slot = slots_[i];
    if (grad.defined() && grad.numel() > 0 &&
        grad.data_ptr() == buckets_[slot.bucket].views[slot.position].data_ptr()) {
      grad = grad.clone();
    }
  }
  // Every bucket complete at once, with zeros; launched and waited for in index order, as the
  // ranks still training launch theirs.
  for (Slot& slot : slots_) slot.ready = true;
  for (Bucket& b : buckets_) {
    b.flat.zero_();
    b.pending = 0;
  }
  launch_ready_buckets();
  if (tracks_usage()) reduce_usage(/*shadow=*/true);
  for (Bucket& b : buckets_) wait_bucket(b);
  // Keeps the bucket rebuild in step with the other ranks: this backward counts as theirs does
  // (the rebuild uses rank 0's order; this one serves when rank 0 is the joined rank).
  if (records_order()) {
    ready_order_.clear();
    for (const Bucket& b : buckets_) {
      ready_order_.insert(ready_order_.end(), b.params.begin(), b.params.end());
    }
    rebuild_due_ = true;
  }
  ++iteration_;
  used_.assign(params_.size(), 0);
  reset();
}

void Reducer::launch_hook(size_t index) {
  Bucket& b = buckets_[index];
  std::vector<at::Tensor> params;
  params.reserve(b.params.size());
  for (size_t i : b.params) params.push_back(params_[i]);
  GradBucket bucket(index, index + 1 == buckets_.size(), b.flat, b.views, std::move(params));
  b.future = comm_hook_(bucket);
  if (!b.future.valid()) {
    throw Error(
        "DistributedDataParallel: the communication hook returned an empty TensorFuture "
        "for bucket " +
        std::to_string(index));
  }
}

void Reducer::wait_bucket(Bucket& b) {
  if (comm_hook_) {
    if (!b.future.valid()) return;  // never launched (a failed backward)
    at::Tensor result = b.future.wait();
    if (!result.defined() || result.numel() != b.flat.numel()) {
      throw Error("DistributedDataParallel: the communication hook's result has " +
                  std::to_string(result.defined() ? result.numel() : 0) +
                  " elements but its bucket " + std::to_string(b.flat.numel()));
    }
    if (result.data_ptr() != b.flat.data_ptr()) b.flat.copy_(result.reshape({-1}));
    return;
  }
  try {
    b.work.wait();
  } catch (...) {
    if (shm_) detail::GroupRecovery::mark_failed(group_);  // a peer died: see training_loop.hpp
    throw;
  }
  if (b.wire.defined() && communicates()) b.flat.copy_(b.wire);
}

}  // namespace ddprun
