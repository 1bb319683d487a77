#include "reducer.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "ddprun/heartbeat.hpp"
#include "group_recovery.hpp"

namespace ddprun {
namespace {

using reducer_detail::assign_buckets;
using reducer_detail::bytes_of;

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                 ProcessGroup& group, const DdpOptions& options)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(group),
      options_(options),
      scale_(1.0 / group.size()) {
  if (options_.bucket_cap_bytes <= 0 || options_.first_bucket_cap_bytes <= 0) {
    throw Error("DistributedDataParallel: bucket caps must be positive");
  }
  if (options_.compression == GradCompression::kBf16 && group.backend() == Backend::kGloo &&
      !compat::kGlooReducesBFloat16) {
    throw Error(
        "DistributedDataParallel: bf16 gradient compression over Gloo needs LibTorch 2.x (this "
        "LibTorch's Gloo cannot all-reduce bfloat16); use fp16 compression or NCCL");
  }
  // Initial layout: reverse parameter order (the last layers' gradients are ready first),
  // launched in that order: buckets holding later parameters first.
  std::vector<size_t> reverse(params_.size());
  for (size_t i = 0; i < reverse.size(); ++i) reverse[i] = reverse.size() - 1 - i;
  auto assignment =
      assign_buckets(params_, reverse, options_.first_bucket_cap_bytes, options_.bucket_cap_bytes);
  std::stable_sort(assignment.begin(), assignment.end(),
                   [](const auto& a, const auto& b) { return a.front() > b.front(); });
  fixed_layout_ = detail::GroupRecovery::channel(group_).has_value();
  // One shared-memory slot for all buckets when every rank is on this host (see
  // shm_allreduce.hpp), sized for any layout (each bucket pads to 64 bytes), so that the
  // rebuilt buckets fit in it too.
  for (const at::Tensor& p : params_) shm_slot_bytes_ += bytes_of(p) + 64;
  if (shared_memory_eligible()) shm_ = ShmAllReduce::create(group_, shm_slot_bytes_);
  used_.assign(params_.size(), 0);
  globally_unused_.assign(params_.size(), 0);
  build_buckets(assignment);
  accumulators_.resize(params_.size());
  hook_keys_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) attach_hook(i);
}

Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void Reducer::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mu_);
  sync_ = sync;
  // A synchronised backward that raised (in the model, or in one of our hooks) never reached
  // finalize(): its buckets are half filled. Say so, instead of a confusing error later.
  bool unfinished = callback_queued_ || next_launch_ > 0;
  for (const Slot& slot : slots_) unfinished = unfinished || slot.ready;
  if (!unfinished) return;
  // No waiting for buckets in flight: a peer may never join them. They finish (or fail) on
  // their own; the state is reset so that a caller who knows better can go on.
  reset();
  callback_queued_ = false;
  throw Error("DistributedDataParallel (rank " + std::to_string(group_.rank()) +
              "): the previous backward pass did not finish reducing gradients (it raised or "
              "was interrupted); the ranks may be out of step");
}

void Reducer::abandon_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  reset();
  callback_queued_ = false;
}

void Reducer::rejoin_transport() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::vector<size_t>> layout;
  for (const Bucket& b : buckets_) layout.push_back(b.params);
  // The gradients move out of the old mapping first, as a bucket rebuild does.
  for (at::Tensor& p : params_) {
    if (p.grad().defined()) p.mutable_grad() = p.grad().clone();
  }
  // The old transport is left as it is (its peers are gone; its worker may still wait): leaked.
  if (shm_) (void)shm_.release();
  // What the constructor does, in the same order: the collectives a replacement runs in its own.
  if (shared_memory_eligible()) shm_ = ShmAllReduce::create(group_, shm_slot_bytes_);
  build_buckets(layout);
}

std::string Reducer::describe(size_t index) const {
  return std::to_string(index) + " (" + names_[index] + ", shape " + shape_of(params_[index]) + ")";
}

void Reducer::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  // Also under no_sync: a parameter used in any backward since the last reduction is used.
  if (tracks_usage()) used_[index] = 1;
  if (!sync_) return;  // no_sync: gradients just accumulate in .grad
  if (!callback_queued_) {
    // Runs when this backward pass ends, on the thread that waits for it.
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
    callback_queued_ = true;
  }
  if (options_.static_graph && iteration_ > 0 && !static_unused_marked_) {
    // The learned unused set is ready at once, so its buckets need not wait for backward's end.
    static_unused_marked_ = true;
    for (size_t i : static_unused_) mark_ready(i, /*got_gradient=*/false);
  }
  if (slots_[index].ready) {
    if (std::find(static_unused_.begin(), static_unused_.end(), index) != static_unused_.end()) {
      throw Error("DistributedDataParallel (rank " + std::to_string(group_.rank()) +
                  ", static_graph): parameter " + describe(index) +
                  " got no gradient in the first iteration but got one now; static_graph needs "
                  "the same parameters used in every iteration");
    }
    throw Error("DistributedDataParallel: parameter " + describe(index) +
                " received a gradient twice in one backward pass (reentrant backward or "
                "activation checkpointing of a shared parameter is not supported)");
  }
  if (records_order()) ready_order_.push_back(index);
  mark_ready(index, /*got_gradient=*/true);
}

void Reducer::mark_ready(size_t index, bool got_gradient) {
  Slot& slot = slots_[index];
  slot.ready = true;
  Bucket& bucket = buckets_[slot.bucket];
  at::Tensor& view = bucket.views[slot.position];
  at::Tensor& grad = params_[index].mutable_grad();
  const bool aliased = grad.defined() && grad.data_ptr() == view.data_ptr();
  if (!grad.defined()) {
    view.zero_();  // unused here: contributes zeros; .grad is set (or not) in finalize()
  } else if (got_gradient && aliased) {
    if (scale_ != 1.0) grad.mul_(scale_);  // .grad already lives in the bucket
  } else {
    // An unused parameter's old .grad is contributed (as PyTorch does) but must come out
    // unchanged if no rank used it: it leaves the bucket, finalize() decides.
    if (aliased) grad = grad.clone();
    if (scale_ != 1.0) {
      at::mul_out(view, grad, at::scalar_tensor(scale_, at::kDouble));
    } else {
      view.copy_(grad);
    }
    if (slot.viewable && got_gradient) grad = view;
  }
  if (--bucket.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    const size_t index = next_launch_++;
    Bucket& b = buckets_[index];
    b.launched = true;
    if (comm_hook_) {
      launch_hook(index);  // also alone: a hook may keep per-iteration state
      continue;
    }
    if (!communicates()) continue;
    if (shm_) {
      b.work = shm_->all_reduce(b.shm_offset, b.flat.numel(), b.flat.scalar_type());
    } else if (b.wire.defined()) {
      b.wire.copy_(b.flat);
      b.work = group_.all_reduce_async(b.wire);
    } else {
      b.work = group_.all_reduce_async(b.flat);
    }
  }
}

void Reducer::finalize() {
  std::lock_guard<std::mutex> lock(mu_);
  callback_queued_ = false;
  std::vector<size_t> missing;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!slots_[i].ready) missing.push_back(i);
  }
  if (!missing.empty()) {
    const bool any_replaced =
        std::any_of(missing.begin(), missing.end(), [this](size_t i) { return replaced(i); });
    if (!tracks_usage() || any_replaced) fail_missing(missing);  // throws
    for (size_t i : missing) mark_ready(i, /*got_gradient=*/false);
  }
  if (tracks_usage()) {
    if (options_.static_graph) static_unused_ = missing;
    reduce_usage();  // after every bucket was launched: the same order on every rank
  }
  for (Bucket& b : buckets_) wait_bucket(b);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (usage_known_ && globally_unused_[i]) continue;  // as PyTorch: .grad left untouched
    const Slot& slot = slots_[i];
    const at::Tensor& view = buckets_[slot.bucket].views[slot.position];
    at::Tensor& grad = params_[i].mutable_grad();
    if (slot.viewable) {
      if (!grad.defined() || grad.data_ptr() != view.data_ptr()) grad = view;  // unused here
    } else if (!grad.defined()) {
      grad = view.clone();
    } else {
      grad.copy_(view);
    }
  }
  if (records_order()) {
    // static_graph: the unused parameters never fire; they go last, as in PyTorch.
    if (options_.static_graph) {
      ready_order_.insert(ready_order_.end(), static_unused_.begin(), static_unused_.end());
    }
    rebuild_due_ = ready_order_.size() == params_.size();
  }
  ++iteration_;
  used_.assign(params_.size(), 0);
  reset();
  heartbeat();  // one synchronised backward done: this worker is making progress
}

void Reducer::fail_missing(const std::vector<size_t>& missing) {
  std::string names;
  for (size_t k = 0; k < missing.size() && k < 10; ++k) {
    names += (k ? ", " : "") + describe(missing[k]);
  }
  if (missing.size() > 10) names += ", ... (" + std::to_string(missing.size()) + " in all)";
  for (Bucket& b : buckets_) {
    if (!b.launched) continue;
    try {
      wait_bucket(b);
    } catch (...) {  // the error below is the one to report
    }
  }
  reset();
  std::string replaced_names;
  for (size_t i : missing) {
    if (replaced(i)) replaced_names += (replaced_names.empty() ? "" : ", ") + describe(i);
  }
  if (!replaced_names.empty()) {
    // Never reduce less than asked without a word: the replicas would drift apart silently.
    throw Error("DistributedDataParallel (rank " + std::to_string(group_.rank()) +
                "): parameters were given new storage after wrapping (Tensor::set_, "
                "Module::load), so their gradients were not reduced: " +
                replaced_names +
                ". Run the forward through the DistributedDataParallel wrapper (it re-attaches "
                "them), or change parameters in place (copy_, ddprun::load_checkpoint)");
  }
  if (options_.static_graph) {
    throw Error("DistributedDataParallel (rank " + std::to_string(group_.rank()) +
                ", static_graph): parameters used in the first iteration got no gradient in "
                "this one: " +
                names + ". static_graph needs the same parameters used in every iteration");
  }
  throw Error("DistributedDataParallel (rank " + std::to_string(group_.rank()) +
              "): parameters got no gradient in this backward pass, so their buckets could not "
              "be reduced: " +
              names +
              ". Every parameter that requires grad must contribute to the loss of every "
              "synchronised iteration; freeze unused ones (requires_grad(false)) before "
              "wrapping the module, or set DdpOptions::find_unused_parameters");
}

void Reducer::reduce_usage(bool shadow) {
  const auto n = static_cast<int64_t>(params_.size());
  at::Tensor used = at::zeros({n}, at::kInt);
  int* mine = used.data_ptr<int>();
  if (!shadow) {
    for (int64_t i = 0; i < n; ++i) mine[i] = used_[static_cast<size_t>(i)];
  } else if (compat::kJoinedRankResendsUsage && reduced_usage_.size() == params_.size()) {
    for (int64_t i = 0; i < n; ++i) mine[i] = reduced_usage_[static_cast<size_t>(i)];
  }
  if (communicates()) {
    used = used.to(group_.device());
    group_.all_reduce(used);
    used = used.cpu();
  }
  const int* sums = used.data_ptr<int>();
  reduced_usage_.assign(sums, sums + n);
  for (size_t i = 0; i < params_.size(); ++i) globally_unused_[i] = sums[i] == 0;
  usage_known_ = true;
}

void Reducer::reset() {
  for (Slot& s : slots_) s.ready = false;
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
    b.work = Work();
    b.future = TensorFuture();
  }
  next_launch_ = 0;
  static_unused_marked_ = false;
  if (!rebuild_due_ && !rebuilt_) ready_order_.clear();  // a failed backward's partial order
}

}  // namespace ddprun
