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

namespace ddprun {
namespace {

// Runs after AccumulateGrad has updated .grad. Our own subclass: LambdaPostHook's constructor
// differs between LibTorch versions.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(Reducer* reducer, size_t index) : reducer_(reducer), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    reducer_->on_grad_ready(index_);
    return outputs;
  }

 private:
  Reducer* reducer_;  // the Reducer removes this hook before it goes away
  size_t index_;
};

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
  build_buckets();
  accumulators_.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>(this, i)));
    accumulators_.push_back(std::move(acc));
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void Reducer::build_buckets() {
  // Greedy fill in reverse parameter order (the last layers' gradients are ready first), one
  // open bucket per (dtype, device); the first bucket of each closes at the small cap.
  using Key = std::tuple<int, int, int>;
  struct Open {
    Bucket bucket;
    int64_t bytes = 0;
    bool first = true;
  };
  std::map<Key, Open> open;
  std::vector<Bucket> done;
  slots_.assign(params_.size(), Slot{});
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    Key key{static_cast<int>(p.scalar_type()), static_cast<int>(p.device().type()),
            static_cast<int>(p.device().index())};
    Open& o = open[key];
    o.bucket.params.push_back(k);
    o.bytes += p.numel() * static_cast<int64_t>(p.element_size());
    const int64_t cap = o.first ? options_.first_bucket_cap_bytes : options_.bucket_cap_bytes;
    if (o.bytes >= cap) {
      done.push_back(std::move(o.bucket));
      o.bucket = Bucket{};
      o.bytes = 0;
      o.first = false;
    }
  }
  for (auto& [key, o] : open) {
    if (!o.bucket.params.empty()) done.push_back(std::move(o.bucket));
  }
  // Launch order = the order gradients arrive: buckets holding later parameters first.
  std::stable_sort(done.begin(), done.end(), [](const Bucket& a, const Bucket& b) {
    return a.params.front() > b.params.front();
  });

  // Storage: one shared-memory slot for all buckets when every rank is on this host (see
  // shm_allreduce.hpp), else ordinary tensors reduced by the process group.
  int64_t slot_bytes = 0;
  for (Bucket& bucket : done) {
    int64_t bytes = 0;
    for (size_t i : bucket.params) bytes += params_[i].numel() * params_[i].element_size();
    bucket.shm_offset = slot_bytes;
    slot_bytes += (bytes + 63) / 64 * 64;
  }
  if (shared_memory_eligible()) shm_ = ShmAllReduce::create(group_, slot_bytes);

  for (size_t b = 0; b < done.size(); ++b) {
    Bucket& bucket = done[b];
    int64_t numel = 0;
    for (size_t i : bucket.params) numel += params_[i].numel();
    const at::Tensor& first = params_[bucket.params.front()];
    bucket.flat = shm_ ? shm_->slot_tensor(bucket.shm_offset, numel, first.scalar_type())
                       : at::zeros({numel}, first.options().requires_grad(false));
    if (options_.compression != GradCompression::kNone && first.is_floating_point()) {
      bucket.wire = at::empty(
          {numel}, bucket.flat.options().dtype(
                       options_.compression == GradCompression::kFp16 ? at::kHalf : at::kBFloat16));
    }
    int64_t offset = 0;
    for (size_t pos = 0; pos < bucket.params.size(); ++pos) {
      const size_t i = bucket.params[pos];
      at::Tensor& p = params_[i];
      // Shares the bucket's storage without being an autograd view: LibTorch 1.13's
      // Optimizer::zero_grad() calls detach_() on every .grad, which views refuse.
      at::Tensor view = at::empty({0}, bucket.flat.options());
      {
        at::NoGradGuard no_grad;
        view.set_(bucket.flat.storage(), bucket.flat.storage_offset() + offset, p.sizes(), {});
      }
      bucket.views.push_back(view);
      offset += p.numel();
      Slot& slot = slots_[i];
      slot.bucket = b;
      slot.position = pos;
      slot.viewable = options_.gradient_as_bucket_view && p.is_contiguous();
      if (slot.viewable && p.grad().defined()) {
        bucket.views.back().copy_(p.grad());
        p.mutable_grad() = bucket.views.back();
      }
    }
    bucket.pending = bucket.params.size();
  }
  buckets_ = std::move(done);
}

bool Reducer::shared_memory_eligible() const {
  // Decided by all ranks together: ShmAllReduce::create is a collective.
  bool local =
      options_.shared_memory && group_.size() > 1 && options_.compression == GradCompression::kNone;
  for (const at::Tensor& p : params_) {
    local = local && p.device().is_cpu() &&
            (p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble);
  }
  if (group_.size() == 1) return false;
  auto flag =
      at::full({1}, local ? 1 : 0, at::TensorOptions().dtype(at::kInt).device(group_.device()));
  group_.all_reduce(flag, ReduceOp::kMin);
  return flag.cpu().item<int>() == 1;
}

std::vector<BucketInfo> Reducer::layout() const {
  std::vector<BucketInfo> out;
  for (const Bucket& b : buckets_) {
    out.push_back(
        BucketInfo{b.params, b.flat.numel() * static_cast<int64_t>(b.flat.element_size())});
  }
  return out;
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

std::string Reducer::describe(size_t index) const {
  return std::to_string(index) + " (" + names_[index] + ", shape " + shape_of(params_[index]) + ")";
}

void Reducer::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sync_) return;  // no_sync: gradients just accumulate in .grad
  if (!callback_queued_) {
    // Runs when this backward pass ends, on the thread that waits for it.
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
    callback_queued_ = true;
  }
  Slot& slot = slots_[index];
  if (slot.ready) {
    throw Error("DistributedDataParallel: parameter " + describe(index) +
                " received a gradient twice in one backward pass (reentrant backward or "
                "activation checkpointing of a shared parameter is not supported)");
  }
  slot.ready = true;
  Bucket& bucket = buckets_[slot.bucket];
  at::Tensor& view = bucket.views[slot.position];
  at::Tensor& grad = params_[index].mutable_grad();
  if (slot.viewable && grad.defined() && grad.data_ptr() == view.data_ptr()) {
    if (scale_ != 1.0) grad.mul_(scale_);  // .grad already lives in the bucket
  } else {
    if (scale_ != 1.0) {
      at::mul_out(view, grad, at::scalar_tensor(scale_, at::kDouble));
    } else {
      view.copy_(grad);
    }
    if (slot.viewable) grad = view;
  }
  if (--bucket.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_++];
    b.launched = true;
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
  if (next_launch_ < buckets_.size()) {
    std::string missing;
    size_t count = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (slots_[i].ready) continue;
      if (count++ < 10) missing += (missing.empty() ? "" : ", ") + describe(i);
    }
    if (count > 10) missing += ", ... (" + std::to_string(count) + " in all)";
    for (Bucket& b : buckets_) {
      if (!b.launched) continue;
      try {
        b.work.wait();
      } catch (...) {  // the error below is the one to report
      }
    }
    reset();
    throw Error("DistributedDataParallel (rank " + std::to_string(group_.rank()) +
                "): parameters got no gradient in this backward pass, so their buckets could not "
                "be reduced: " +
                missing +
                ". Every parameter that requires grad must contribute to the loss of every "
                "synchronised iteration; freeze unused ones (requires_grad(false)) before "
                "wrapping the module");
  }
  for (Bucket& b : buckets_) {
    b.work.wait();
    if (b.wire.defined() && communicates()) b.flat.copy_(b.wire);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const Slot& slot = slots_[i];
    if (!slot.viewable) params_[i].mutable_grad().copy_(buckets_[slot.bucket].views[slot.position]);
  }
  reset();
  heartbeat();  // one synchronised backward done: this worker is making progress
}

void Reducer::reset() {
  for (Slot& s : slots_) s.ready = false;
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
    b.work = Work();
  }
  next_launch_ = 0;
}

}  // namespace ddprun
