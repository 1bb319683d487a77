// ZeroRedundancyOptimizer: optimizer state sharded across the ranks of a data-parallel job, the
// C++ counterpart of torch.distributed.optim.ZeroRedundancyOptimizer.
//
//   ddprun::DistributedDataParallel ddp(net, pg);
//   auto opt = ddprun::make_zero<torch::optim::Adam>(net->parameters(), pg,
//                                                    torch::optim::AdamOptions(1e-3));
//   // or with any optimizer built from a shard of the parameters:
//   ddprun::ZeroRedundancyOptimizer opt(net->parameters(), pg, [](std::vector<at::Tensor> shard) {
//     return std::make_unique<torch::optim::SGD>(shard, SGDOptions(0.1).momentum(0.9));
//   });
//   opt.zero_grad();
//   loss_fn(ddp(x), y).backward();    // every rank holds every averaged gradient
//   opt.step();                       // same parameters as an unsharded optimizer's step
//
// Each parameter is owned by one rank (PyTorch's partition: parameters sorted by size, largest
// first, each given to the rank with the fewest elements so far, the lowest such rank on a tie).
// Each rank runs the wrapped optimizer on its own parameters only, so it holds the state
// (momentum, Adam moments) of about 1/world of the model; step() then broadcasts every parameter
// from its owner, coalesced into one flat buffer per owner rank, dtype and device.
//
// It is a torch::optim::Optimizer holding all parameters in one group: zero_grad() clears every
// gradient, and a scheduler's change of param_groups()[0].options() (the learning rate) reaches
// the local optimizer at the next step().
//
// Checkpoints: the saved form is the unsharded optimizer's (the wrapped optimizer over all
// parameters, in order), so a checkpoint written from a ZeroRedundancyOptimizer loads into a
// plain optimizer and the other way round, with any world size.
//   opt.consolidate_state_dict(0);                             // collective: state to rank 0
//   if (pg->rank() == 0) ddprun::save_checkpoint(path, progress, *net, opt);  // calls opt.save()
//   ddprun::load_checkpoint(*pg, path, *net, opt);             // every rank keeps its shard
// save() without a preceding consolidate_state_dict() to this rank throws ddprun::Error; it
// writes the state as of that consolidation.
//
// Collectives (step, consolidate_state_dict) must be called on every rank in the same order.
// One thread at a time. Not copyable.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/process_group.hpp"

namespace ddprun {

struct ZeroOptions {
  // Each parameter's data becomes a view of its broadcast buffer (PyTorch's option of the same
  // name): no copies in and out of the buffers, and no extra memory for them. Set it when
  // nothing else holds on to the parameters' old storage (create the optimizer after wrapping
  // the model in DistributedDataParallel and before any other view of the parameters).
  bool parameters_as_bucket_view = false;
};

// Which rank owns which parameter: PyTorch's ZeroRedundancyOptimizer partition of parameters of
// `numels` elements over `world` ranks. Result[r]: the indices rank r owns, in the order given to
// its optimizer (largest first, ties in index order).
std::vector<std::vector<size_t>> partition_parameters(const std::vector<int64_t>& numels,
                                                      int world);

// Bytes of the tensors in an optimizer's per-parameter state (SGD's momentum buffers, Adam's and
// AdamW's moments, Adagrad's sums, RMSprop's averages). Throws ddprun::Error for other state
// types.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

class ZeroRedundancyOptimizer : public torch::optim::Optimizer {
 public:
  // Builds the optimizer of one rank's shard (possibly empty) with one parameter group. Called
  // once for this rank's shard, and again for temporary unsharded copies in save() and load().
  using OptimizerFactory =
      std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor> shard)>;

  // Not a collective. Every rank passes the same parameters in the same order.
  ZeroRedundancyOptimizer(std::vector<torch::Tensor> parameters,
                          std::shared_ptr<ProcessGroup> group, OptimizerFactory make_optimizer,
                          ZeroOptions options = {});
  ~ZeroRedundancyOptimizer() override;

  // The local optimizer steps (parameters without a gradient are skipped, as torch::optim does),
  // then every parameter is broadcast from its owner. Collective. Returns the closure's loss
  // when one is given (evaluated by the local optimizer).
  torch::Tensor step(LossClosure closure = nullptr) override;

  // Clears the gradients of all parameters, as torch::optim::Optimizer::zero_grad of the
  // LibTorch version built against does by default (set to none from 2.0, zeros before).
  static constexpr bool kDefaultSetToNone = TORCH_VERSION_MAJOR >= 2;
  void zero_grad(bool set_to_none = kDefaultSetToNone);

  // The owner rank of each parameter, by index in the constructor's `parameters`.
  const std::vector<int>& owners() const { return owners_; }
  // Indices of the parameters each rank owns (partition_parameters()).
  const std::vector<std::vector<size_t>>& partition() const { return partition_; }
  // This rank's optimizer (its parameters: partition()[rank], in that order).
  torch::optim::Optimizer& local_optimizer() { return *local_; }
  const torch::optim::Optimizer& local_optimizer() const { return *local_; }
  // Bytes of the optimizer state held on this rank (optimizer_state_bytes of the local one).
  int64_t local_state_bytes() const;

  // Collective: gathers every rank's optimizer state on rank `to` (as CPU bytes), for save().
  void consolidate_state_dict(int to = 0);
  // The unsharded optimizer's archive, from the last consolidation onto this rank.
  void save(torch::serialize::OutputArchive& archive) const override;
  // Reads an unsharded optimizer's archive (from save(), or a plain optimizer's save() over the
  // same parameters); keeps the state of this rank's parameters and the group's options as the
  // wrapped optimizer's load() does. Not a collective; every rank calls it with the same archive.
  void load(torch::serialize::InputArchive& archive) override;

 private:
  struct Bucket;
  void broadcast_parameters();
  std::unique_ptr<torch::optim::Optimizer> unsharded() const;

  std::shared_ptr<ProcessGroup> group_;
  OptimizerFactory make_optimizer_;
  ZeroOptions options_;
  std::vector<torch::Tensor> all_;  // the constructor's parameters, in order
  std::vector<int> owners_;
  std::vector<std::vector<size_t>> partition_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  std::vector<Bucket> buckets_;
  std::vector<std::string> consolidated_;  // each rank's local archive, on the `to` rank only
};

// ZeroRedundancyOptimizer over optimizer type `Opt` (torch::optim::SGD, Adam, AdamW, ...)
// constructed as Opt(shard, options).
template <typename Opt, typename Options>
ZeroRedundancyOptimizer make_zero(std::vector<torch::Tensor> parameters,
                                  std::shared_ptr<ProcessGroup> group, Options options,
                                  ZeroOptions zero_options = {}) {
  return ZeroRedundancyOptimizer(
      std::move(parameters), std::move(group),
      [options](std::vector<torch::Tensor> shard) -> std::unique_ptr<torch::optim::Optimizer> {
        return std::make_unique<Opt>(std::move(shard), options);
      },
      zero_options);
}

}  // namespace ddprun
