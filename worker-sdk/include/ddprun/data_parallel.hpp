// DistributedDataParallel for torch::nn::Module: the C++ counterpart of
// torch.nn.parallel.DistributedDataParallel.
//
//   auto pg = ddprun::init_process_group();
//   Net net;                                   // a TORCH_MODULE holder or a shared_ptr<Module>
//   net->to(pg->device());
//   ddprun::DistributedDataParallel ddp(net, pg);
//   torch::optim::SGD opt(net->parameters(), 0.1);
//   for (...) {
//     opt.zero_grad();
//     auto loss = loss_fn(ddp(x), y);          // ddp(...) == ddp.forward(...) == net->forward(...)
//     loss.backward();                         // returns with gradients averaged across ranks
//     opt.step();
//   }
//
// What it does (as PyTorch's DDP does):
// - construction: checks that every rank has the same parameters (names, dtypes, shapes; the
//   error names the rank and the parameter), then broadcasts parameters and buffers from rank 0;
// - gradients go into buckets (parameters in reverse order; the first bucket closes at 1 MiB,
//   the others at 25 MiB); a post-hook on each parameter's gradient accumulator copies the
//   gradient, scaled by 1/world, into its bucket, and a full bucket's all-reduce starts at once,
//   so communication overlaps the rest of backward. Buckets start in index order on every rank.
//   When backward ends, all buckets are waited for: backward() returns averaged gradients;
// - with gradient_as_bucket_view (default), each .grad becomes a view of its bucket, which saves
//   two copies per step; zero_grad() (in place, or set-to-none) keeps working;
// - no_sync(): backward passes of forwards run under it only accumulate locally; the next
//   synchronised backward reduces the sum;
// - broadcast_buffers: rank 0's buffers (e.g. BatchNorm statistics) are broadcast before each
//   forward run with grad mode on;
// - a parameter that gets no gradient in a synchronised backward is an error (thrown from
//   backward()) naming the parameters, unless find_unused_parameters or static_graph is set:
//   then it contributes zeros to the average (a parameter used on some ranks only gets the sum
//   of their gradients / world), and one unused on every rank keeps its .grad untouched (an
//   undefined .grad stays undefined), as in PyTorch. Unused parameters are found when backward
//   ends (PyTorch searches the graph at forward time; the numbers are the same, their buckets
//   just start later). static_graph learns the set in the first iteration and reuses it;
// - buckets are rebuilt once, before the first forward after the first synchronised backward
//   (the second with static_graph; never with find_unused_parameters alone), in the order the
//   gradients became ready there: rank 0's order, broadcast, so every rank has the same layout;
// - optional fp16/bf16 compression of gradients on the wire; communication hooks
//   (register_comm_hook: all-reduce, fp16/bf16 compression, PowerSGD, or the user's own);
// - on one host with CPU tensors, buckets are reduced through shared memory (DdpOptions);
// - before each forward through the wrapper, a parameter given new storage since (Tensor::set_,
//   LibTorch's Module::load) gets its gradient hook back, and one whose shape, dtype or device
//   changed is an error naming it; a backward whose forward bypassed the wrapper after such a
//   replacement throws rather than reduce fewer gradients than it should. ddprun::load_checkpoint
//   copies in place and replaces nothing.
//
// Threads: forward/backward from one thread at a time (the autograd engine may run the hooks on
// its device threads). Not copyable or movable: hooks point at the object.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddprun/comm_hooks.hpp"
#include "ddprun/join.hpp"
#include "ddprun/process_group.hpp"

namespace ddprun {

enum class GradCompression { kNone, kFp16, kBf16 };

struct DdpOptions {
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;
  int64_t first_bucket_cap_bytes = 1024 * 1024;
  bool broadcast_buffers = true;
  bool gradient_as_bucket_view = true;
  GradCompression compression = GradCompression::kNone;
  // When every rank runs on this host (same kernel and namespaces) and the gradients are CPU
  // float/double, reduce buckets through shared memory instead of the process group: a few
  // times faster than Gloo's loopback TCP. Falls back to the process group otherwise, or when
  // DDPRUN_SHM=0 is set. Results are the same (sums in rank order).
  bool shared_memory = true;
  // Parameters that get no gradient in an iteration (a branch taken on some steps or ranks only)
  // are reduced as zeros instead of raising. Costs one small all-reduce per iteration.
  bool find_unused_parameters = false;
  // The set of parameters used (per rank) is the same in every iteration: learned in the first
  // synchronised backward, then reused without a per-iteration all-reduce. A later iteration
  // that uses a different set is an error. Takes precedence over find_unused_parameters.
  bool static_graph = false;
};

// One bucket of the layout: indices into the module's trainable parameters (those that require
// grad, in module->parameters() order), in the order the bucket is filled.
struct BucketInfo {
  std::vector<size_t> parameters;
  int64_t bytes = 0;
};

class Reducer;  // the bucketing engine (internal)

// The non-template part of DistributedDataParallel; usable on its own by calling
// prepare_forward() before each forward of the wrapped module. A Joinable (join.hpp): under a
// Join, ranks may run different numbers of iterations.
class DataParallel : public Joinable {
 public:
  DataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group,
               DdpOptions options = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Broadcasts buffers (when enabled) and fixes whether the coming backward synchronises.
  void prepare_forward();

  // Joinable (see join.hpp).
  void join_shadow(const JoinRound& round) override;
  void join_finish(bool is_last_joiner) override;
  ProcessGroup& join_process_group() override { return *group_; }

  // RAII: while alive, forwards are run without gradient synchronisation.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_) { ddp.sync_ = false; }
    ~NoSyncGuard() { ddp_.sync_ = previous_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // Forgets a backward pass whose gradient reductions failed because a rank died, so the step
  // can run again once the group is rebuilt (TrainingLoop does this: training_loop.hpp).
  void abandon_backward();
  // After the process group was rebuilt with a replacement: the gradient transport joins it
  // (collectives, in the order a replacement's constructor runs them).
  void rejoin_group();

  // Buckets are reduced by `hook` from now on (see comm_hooks.hpp): once, before the first
  // backward, on every rank. Replaces the built-in all-reduce, the shared-memory transport and
  // DdpOptions::compression (which must be off).
  void register_comm_hook(CommHook hook);

  const DdpOptions& options() const { return options_; }
  // How buckets are reduced: "comm hook", "shared memory", or the process group's backend
  // ("gloo", "nccl").
  std::string transport() const;
  ProcessGroup& process_group() const { return *group_; }
  std::vector<BucketInfo> buckets() const;
  // This rank's gradient ready order (indices as in BucketInfo) in the synchronised backward the
  // bucket rebuild is based on; empty until that backward ran (and with find_unused_parameters
  // alone, which never rebuilds). The rebuild itself uses rank 0's order.
  std::vector<size_t> grad_ready_order() const;
  // Whether the buckets have been rebuilt in ready order (see above).
  bool buckets_rebuilt() const;

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  // Broadcasts the buffers from rank 0, or under a Join from the highest rank still training
  // (`training`: whether this rank is).
  void sync_buffers(bool training);
  // The highest rank for which `candidate` is true, agreed by all (a collective).
  int highest_rank_where(bool candidate);

  std::unique_ptr<Reducer> reducer_;
  bool sync_ = true;
};

namespace detail {
template <typename M, typename = void>
struct HasPtr : std::false_type {};
template <typename M>
struct HasPtr<M, std::void_t<decltype(std::declval<const M&>().ptr())>> : std::true_type {};

template <typename M>
std::shared_ptr<torch::nn::Module> module_ptr(const M& m) {
  if constexpr (HasPtr<M>::value) {
    return m.ptr();  // torch::nn::ModuleHolder (TORCH_MODULE)
  } else {
    return m;  // std::shared_ptr<SomeModule>
  }
}
}  // namespace detail

// The wrapper users hold: forwards calls to the module's own forward().
template <typename ModuleHolder>
class DistributedDataParallel : public DataParallel {
 public:
  DistributedDataParallel(ModuleHolder module, std::shared_ptr<ProcessGroup> group,
                          DdpOptions options = {})
      : DataParallel(detail::module_ptr(module), std::move(group), options),
        module_(std::move(module)) {}

  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    prepare_forward();
    return module_->forward(std::forward<Args>(args)...);
  }
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  ModuleHolder& module() { return module_; }

 private:
  ModuleHolder module_;
};

}  // namespace ddprun
