#include "ddprun/training_loop.hpp"

#include <ATen/ATen.h>

#include <iostream>

#include "ddprun/zero_optimizer.hpp"
#include "group_recovery.hpp"
#include "training_state.hpp"

namespace ddprun {
namespace {

using detail::GroupRecovery;

// How long a survivor waits for ddprun's word after a collective failed. ddprun announces a
// recovery within milliseconds of a rank's death; a collective that failed for another reason
// gets no word, and its error is raised after this.
constexpr std::chrono::seconds kNoticeWait{30};

}  // namespace

TrainingLoop::TrainingLoop(DataParallel& ddp, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer)
    : ddp_(ddp), model_(model), optimizer_(optimizer) {
  if (!GroupRecovery::channel(ddp_.process_group())) return;
  if (ddp_.options().static_graph) {
    throw Error(
        "TrainingLoop: in-process recovery does not support DdpOptions::static_graph (a "
        "replacement would learn the graph alone); turn one of them off");
  }
  if (dynamic_cast<const ZeroRedundancyOptimizer*>(&optimizer_) != nullptr) {
    throw Error(
        "TrainingLoop: in-process recovery cannot hand a replacement its "
        "ZeroRedundancyOptimizer shard (it died with its rank); use a plain optimizer, or "
        "ddprun without --in-process-recovery");
  }
}

TrainingLoop::~TrainingLoop() {
  announce(false);
}

int64_t TrainingLoop::run(int64_t first, int64_t last, const StepFn& step,
                          const AfterStepFn& after_step) {
  ProcessGroup& pg = ddp_.process_group();
  done_ = first;
  if (GroupRecovery::awaiting_state(pg)) {
    receive_state();
    ++recoveries_;
  }
  announce(true);
  while (done_ < last) {
    try {
      optimizer_.zero_grad();
      step(done_);
      optimizer_.step();
      ++done_;
      if (after_step) after_step(done_);
    } catch (...) {
      if (!recover()) {
        announce(false);
        throw;
      }
    }
  }
  announce(false);
  return done_;
}

bool TrainingLoop::recover() {
  ProcessGroup& pg = ddp_.process_group();
  const auto& channel = GroupRecovery::channel(pg);
  if (!channel || !GroupRecovery::failed(pg)) return false;
  const auto began = std::chrono::steady_clock::now();
  const std::optional<int> generation = channel->await_notice(pg.generation(), kNoticeWait);
  if (!generation) return false;
  ddp_.abandon_backward();
  GroupRecovery::rebuild(pg, *generation);
  ddp_.rejoin_group();  // what the replacement's DDP constructor does meanwhile
  receive_state();
  ++recoveries_;
  announce(true);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - began)
                      .count();
  std::cerr << "[ddprun] rank " << pg.rank() << ": in-process recovery to generation "
            << *generation << " in " << ms << " ms; training goes on at step " << done_
            << std::endl;
  return true;
}

void TrainingLoop::receive_state() {
  ProcessGroup& pg = ddp_.process_group();
  // The rank furthest ahead is the source: a rank may have completed the failed step's
  // optimizer step (its reduction finished just before the death) while another had not.
  const bool have = !GroupRecovery::awaiting_state(pg);
  at::Tensor mine = at::full({1}, have ? done_ : int64_t{-1}, at::kLong).to(pg.device());
  std::vector<at::Tensor> all = pg.all_gather(mine);
  int source = -1;
  int64_t best = -1;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const int64_t d = all[static_cast<size_t>(r)].cpu().item<int64_t>();
    if (d > best) best = d, source = r;
  }
  if (source < 0) throw Error("TrainingLoop: no rank holds the training state");
  std::string bytes;
  if (pg.rank() == source)
    bytes = detail::training_state_bytes({0, done_, {}}, model_, optimizer_);
  bytes = pg.broadcast_bytes(bytes, source);
  if (pg.rank() != source && (!have || done_ != best)) {
    detail::restore_training_state(bytes.data(), bytes.size(), pg.device(), model_, optimizer_);
  }
  done_ = best;
  GroupRecovery::state_received(pg);
}

void TrainingLoop::announce(bool in_loop) const {
  const ProcessGroup& pg = ddp_.process_group();
  if (const auto& channel = GroupRecovery::channel(pg)) {
    channel->announce_ready(pg.rank(), in_loop ? pg.generation() : -1);
  }
}

}  // namespace ddprun
