// A training loop that survives the death of a rank: with `ddprun --in-process-recovery`, when
// a rank dies the others keep their processes (and everything in their memory), ddprun starts
// a replacement for the dead rank alone, the group is rebuilt with it, a survivor hands it the
// model and optimizer state, and every rank goes on at the step that failed. Without that flag
// (or under another launcher) the same loop just runs the steps.
//
//   auto pg = ddprun::init_process_group();
//   Net model(...);
//   torch::optim::SGD optimizer(model->parameters(), 0.1);
//   auto saved = ddprun::load_checkpoint(*pg, path, *model, optimizer);  // a replacement: nullopt
//   ddprun::DistributedDataParallel ddp(model, pg);
//   ddprun::TrainingLoop loop(ddp, *model, optimizer);
//   loop.run(saved ? saved->step : 0, steps,
//            [&](int64_t step) {  // the forward and backward of `step`; may run again
//              torch::nn::functional::cross_entropy(ddp(x_of(step)), y_of(step)).backward();
//            },
//            [&](int64_t done) {  // after the optimizer step: logging, checkpoints
//              if (pg->rank() == 0 && done % 100 == 0) ddprun::save_checkpoint(...);
//            });
//
// What the loop asks of the code around it:
// - `step` computes the gradients of step `step` from the model and the step number alone (the
//   batch a function of the step, as DistributedSampler's indices are): after a recovery the
//   failed step runs again on every rank. The loop calls optimizer.zero_grad() before it and
//   optimizer.step() after it, so a failed step never half-updates the model.
// - `after_step` runs once per completed step; if a rank dies during it, it is not run again.
// - The state that moves to a replacement is the model's parameters and buffers, the
//   optimizer's state and the step: replicated state, as plain DDP has. Not supported: a
//   ZeroRedundancyOptimizer (its shards die with their rank) and DdpOptions::static_graph
//   (the constructor refuses both under ddprun --in-process-recovery), Join, and
//   communication hooks with state of their own (PowerSGD).
// - Before run(), a replacement has no state: load_checkpoint returns nullopt for it and the
//   DDP wrapper skips its initial broadcast; any other collective the ranks make before run()
//   must be skipped when pg->generation() > 0.
// - Gloo only: over NCCL the job restarts as usual (an NCCL communicator cannot be abandoned
//   the way a Gloo context can).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>

#include "ddprun/data_parallel.hpp"

namespace ddprun {

class TrainingLoop {
 public:
  using StepFn = std::function<void(int64_t step)>;
  using AfterStepFn = std::function<void(int64_t steps_done)>;

  // `ddp` wraps `model`; all three must outlive the loop.
  TrainingLoop(DataParallel& ddp, torch::nn::Module& model, torch::optim::Optimizer& optimizer);
  ~TrainingLoop();
  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  // Runs steps [first, last): zero_grad, step(s), optimizer.step(), after_step(s + 1). A
  // replacement starts where the survivors are, whatever `first` says. Returns the steps done
  // (`last`). Throws what a step throws, unless it was the death of another rank that ddprun
  // is recovering from.
  int64_t run(int64_t first, int64_t last, const StepFn& step, const AfterStepFn& after_step = {});

  // In-process recoveries this process took part in (as a survivor or as the replacement).
  int recoveries() const { return recoveries_; }

 private:
  bool recover();        // after a failed step: false when it was no rank's death
  void receive_state();  // every rank: the state of the rank furthest ahead
  void announce(bool in_loop) const;

  DataParallel& ddp_;
  torch::nn::Module& model_;
  torch::optim::Optimizer& optimizer_;
  int64_t done_ = 0;  // steps completed (optimizer steps taken)
  int recoveries_ = 0;
};

}  // namespace ddprun
