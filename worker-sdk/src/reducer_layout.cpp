// The Reducer's bucket layout (the parameters' hooks, the buckets and their rebuild in rank 0's
// gradient order); the backward's flow is in reducer.cpp, communication hooks and Join in
// reducer_hooks.cpp.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <map>
#include <sstream>
#include <tuple>

#include "reducer.hpp"

namespace ddprun {

namespace reducer_detail {

int64_t bytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

std::vector<std::vector<size_t>> assign_buckets(const std::vector<at::Tensor>& params,
                                                const std::vector<size_t>& order, int64_t first_cap,
                                                int64_t cap) {
  using Key = std::tuple<int, int, int>;
  struct Open {
    std::vector<size_t> params;
    int64_t bytes = 0;
    bool first = true;
  };
  std::map<Key, Open> open;
  std::vector<std::vector<size_t>> done;
  for (size_t k : order) {
    const at::Tensor& p = params[k];
    Open& o = open[Key{static_cast<int>(p.scalar_type()), static_cast<int>(p.device().type()),
                       static_cast<int>(p.device().index())}];
    o.params.push_back(k);
    o.bytes += bytes_of(p);
    if (o.bytes >= (o.first ? first_cap : cap)) {
      done.push_back(std::move(o.params));
      o = Open{{}, 0, false};
    }
  }
  for (auto& [key, o] : open) {
    if (!o.params.empty()) done.push_back(std::move(o.params));
  }
  return done;
}

}  // namespace reducer_detail

namespace {

using reducer_detail::assign_buckets;
using reducer_detail::bytes_of;

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

}  // namespace

void Reducer::attach_hook(size_t index) {
  auto acc = torch::autograd::impl::grad_accumulator(params_[index]);
  if (!acc) {
    throw Error("DistributedDataParallel: parameter " + describe(index) +
                " no longer requires a gradient; freeze parameters before wrapping the module");
  }
  hook_keys_[index] = acc->add_post_hook(std::make_unique<GradReadyHook>(this, index));
  accumulators_[index] = std::move(acc);
}

bool Reducer::replaced(size_t index) const {
  return torch::autograd::impl::try_get_grad_accumulator(params_[index]).get() !=
         accumulators_[index].get();
}

void Reducer::reattach_replaced_parameters() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!replaced(i)) continue;
    const at::Tensor& p = params_[i];
    const Slot& slot = slots_[i];
    const at::Tensor& view = buckets_[slot.bucket].views[slot.position];
    if (p.sizes() != view.sizes() || p.scalar_type() != view.scalar_type() ||
        p.device() != view.device()) {
      std::ostringstream was;
      was << view.scalar_type() << " " << view.sizes() << " on " << view.device();
      std::ostringstream now;
      now << p.scalar_type() << " " << p.sizes() << " on " << p.device();
      throw Error("DistributedDataParallel: parameter " + std::to_string(i) + " (" + names_[i] +
                  ") was replaced after wrapping by a tensor of " + now.str() + " (it was " +
                  was.str() + "); change a model's parameters in place (copy_, " +
                  "ddprun::load_checkpoint), or wrap the model after changing them");
    }
    accumulators_[i]->del_post_hook(hook_keys_[i]);
    attach_hook(i);
    slots_[i].viewable = options_.gradient_as_bucket_view && p.is_contiguous();
  }
}

void Reducer::build_buckets(const std::vector<std::vector<size_t>>& assignment) {
  std::vector<Bucket> done(assignment.size());
  slots_.assign(params_.size(), Slot{});
  int64_t shm_bytes = 0;
  for (size_t b = 0; b < done.size(); ++b) {
    done[b].params = assignment[b];
    int64_t bytes = 0;
    for (size_t i : done[b].params) bytes += bytes_of(params_[i]);
    done[b].shm_offset = shm_bytes;
    shm_bytes += (bytes + 63) / 64 * 64;
  }

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

void Reducer::rebuild_buckets_if_due() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!rebuild_due_) return;
  rebuild_due_ = false;
  rebuilt_ = true;
  // Rank 0's order on every rank, so that all build the same buckets.
  const auto n = static_cast<int64_t>(params_.size());
  at::Tensor order = at::empty({n}, at::kLong);
  for (int64_t i = 0; i < n; ++i) order[i] = static_cast<int64_t>(ready_order_[i]);
  if (group_.size() > 1) {
    order = order.to(group_.device());
    group_.broadcast(order, 0);
    order = order.cpu();
  }
  std::vector<size_t> rank0_order(params_.size());
  for (int64_t i = 0; i < n; ++i) rank0_order[i] = static_cast<size_t>(order[i].item<int64_t>());
  // Gradients that live in the old buckets move to their own storage first: the new buckets
  // reuse the shared-memory slot. build_buckets() copies them into the new views.
  for (at::Tensor& p : params_) {
    if (p.grad().defined()) p.mutable_grad() = p.grad().clone();
  }
  build_buckets(assign_buckets(params_, rank0_order, options_.first_bucket_cap_bytes,
                               options_.bucket_cap_bytes));
}

std::vector<size_t> Reducer::local_ready_order() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (rebuild_due_ || rebuilt_) return ready_order_;
  return {};
}

bool Reducer::rebuilt() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rebuilt_;
}

}  // namespace ddprun
