// The gradient bucketing engine behind DistributedDataParallel. Internal.
//
// Owns one flat tensor per bucket, a post-hook on every parameter's gradient accumulator (and
// the accumulators themselves, which parameters only reference weakly), and the in-flight
// all-reduces. Hooks may run on autograd's device threads; all state is guarded by mu_.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "compat.hpp"
#include "ddprun/comm_hooks.hpp"
#include "ddprun/data_parallel.hpp"
#include "ddprun/process_group.hpp"
#include "shm_allreduce.hpp"

namespace ddprun {

namespace reducer_detail {
int64_t bytes_of(const at::Tensor& t);
// Greedy fill in `order`, one open bucket per (dtype, device); a bucket closes once it reaches
// its cap (the first of each kind: first_cap). Buckets come out in the order they closed, then
// the open ones.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<at::Tensor>& params,
                                                const std::vector<size_t>& order, int64_t first_cap,
                                                int64_t cap);
}  // namespace reducer_detail

class Reducer {
 public:
  // `params` are the trainable parameters in module order; `names` their qualified names.
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, ProcessGroup& group,
          const DdpOptions& options);
  ~Reducer();  // removes the hooks
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Whether the next backward all-reduces (false under no_sync).
  void set_sync(bool sync);
  // Forgets a backward whose reductions failed (a peer died: in-process recovery), without the
  // error set_sync() raises for one: the buckets in flight are abandoned with their generation.
  void abandon_backward();
  // After the process group was rebuilt with a replacement (in-process recovery): the
  // shared-memory transport made again with it (the same collectives as the constructor's, in
  // the same order, which the replacement runs in its own), the buckets kept as they were.
  void rejoin_transport();
  // Buckets go to `hook` instead of the built-in all-reduce. Before the first backward only.
  void set_comm_hook(CommHook hook);
  // The built-in reduction averages over `ranks` (default: the group's size); under a Join
  // that does not divide by the initial world size, the ranks still training.
  void set_divisor(int ranks);
  // A joined rank's stand-in for a synchronised backward: the same collectives, with zeros.
  void shadow_backward();
  std::vector<BucketInfo> layout() const;
  bool uses_shared_memory() const { return shm_ != nullptr; }
  bool has_comm_hook() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<bool>(comm_hook_);
  }

  // Called by the accumulator hook of parameter `index` after its .grad was updated.
  void on_grad_ready(size_t index);

  // Before each forward: a parameter given new storage since the last one (Tensor::set_,
  // LibTorch's Module::load) lost the gradient accumulator our hook sat on, and its gradients
  // would never be reduced. Its hook is attached again to its new accumulator. A parameter whose
  // shape, dtype or device changed no longer fits its bucket: ddprun::Error naming it.
  void reattach_replaced_parameters();

  // Before a forward with grad mode on (every rank together: a collective when due): rebuilds
  // the buckets once, in rank 0's gradient ready order. See data_parallel.hpp.
  void rebuild_buckets_if_due();
  std::vector<size_t> local_ready_order() const;
  bool rebuilt() const;

 private:
  struct Bucket {
    at::Tensor flat;                // gradients, packed, in the parameters' dtype
    at::Tensor wire;                // fp16/bf16 copy sent instead of `flat`, when compressing
    int64_t shm_offset = 0;         // where `flat` lives in the shared-memory slot
    std::vector<size_t> params;     // parameter indices, in fill order
    std::vector<at::Tensor> views;  // views[i]: params[i]'s slice of `flat`, shaped like it
    size_t pending = 0;             // gradients still missing in this backward
    bool launched = false;
    Work work;
    TensorFuture future;  // with a communication hook, instead of `work`
  };
  struct Slot {
    size_t bucket = 0;
    size_t position = 0;  // index into Bucket::params/views
    bool ready = false;
    bool viewable = false;  // contiguous: .grad can alias the bucket
  };

  // `assignment`: parameter indices per bucket, buckets in launch order.
  void build_buckets(const std::vector<std::vector<size_t>>& assignment);
  bool shared_memory_eligible() const;
  // Its gradient (or zeros, if it has none) into its bucket; got_gradient: from the hook, not
  // marked as unused.
  void mark_ready(size_t index, bool got_gradient);
  void launch_ready_buckets();  // in index order, as far as complete
  void launch_hook(size_t index);
  void wait_bucket(Bucket& b);  // its reduction done, the result in b.flat
  void finalize();              // end of backward (autograd engine callback)
  void fail_missing(const std::vector<size_t>& missing);
  // Parameter `index` no longer has the accumulator our hook is on (see above).
  bool replaced(size_t index) const;
  void attach_hook(size_t index);
  // Which parameters no rank used (globally_unused_). `shadow`: this rank has joined and
  // contributes no usage of its own (see compat::kJoinedRankResendsUsage).
  void reduce_usage(bool shadow = false);
  void reset();
  // Unused parameters found at backward's end: find_unused_parameters alone, or static_graph's
  // first iteration (which learns the set).
  bool tracks_usage() const {
    return options_.static_graph ? iteration_ == 0 : options_.find_unused_parameters;
  }
  // The backward whose ready order the rebuild uses, as PyTorch: the first synchronised one, the
  // second with static_graph (the first only counts), none with find_unused_parameters alone.
  bool records_order() const {
    if (rebuilt_ || rebuild_due_ || fixed_layout_) return false;
    if (options_.static_graph) return iteration_ == 1;
    return !options_.find_unused_parameters && iteration_ == 0;
  }
  // Alone on a CPU there is nothing to exchange. NCCL keeps the collective (a cheap kernel), so a
  // one-GPU run takes the path multi-GPU runs take.
  bool communicates() const { return group_.size() > 1 || group_.backend() == Backend::kNccl; }
  std::string describe(size_t index) const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  ProcessGroup& group_;
  DdpOptions options_;
  double scale_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
  std::vector<compat::GradAccumulatorPtr> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  std::unique_ptr<ShmAllReduce> shm_;  // same-host transport for the buckets, when usable
  int64_t shm_slot_bytes_ = 0;         // its slot per rank: room for any bucket layout
  CommHook comm_hook_;                 // empty: the built-in all-reduce (shm_ or the group)

  mutable std::mutex mu_;
  bool sync_ = true;
  bool callback_queued_ = false;
  size_t next_launch_ = 0;

  int64_t iteration_ = 0;                 // synchronised backwards completed
  std::vector<uint8_t> used_;             // got a gradient since the last synchronised backward
  std::vector<uint8_t> globally_unused_;  // no rank used it (.grad is left alone)
  std::vector<int> reduced_usage_;        // the last usage all-reduce's sums, per parameter
  bool usage_known_ = false;              // globally_unused_ is valid
  std::vector<size_t> static_unused_;     // static_graph: this rank's unused set, learned
  bool static_unused_marked_ = false;     // marked ready in this backward already
  std::vector<size_t> ready_order_;       // this rank's, from the backward records_order() names
  bool rebuild_due_ = false;
  bool rebuilt_ = false;
  // In-process recovery: a replacement must build the buckets the survivors have, so nobody
  // rebuilds them (the rebuild is a collective of the first iterations, which a replacement
  // would run alone).
  bool fixed_layout_ = false;
};

}  // namespace ddprun
