// ProcessGroup's state (ddprun/process_group.hpp), shared by process_group.cpp (creation,
// generations, waits) and collectives.cpp. Internal to the SDK.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "backends.hpp"
#include "compat.hpp"
#include "ddprun/process_group.hpp"
#include "recovery_channel.hpp"

namespace ddprun {

// One generation of a group, as its collectives' waits see it (in-process recovery only).
struct GenerationWatch {
  const detail::RecoveryChannel* channel = nullptr;  // null: plain waits
  int generation = 0;
  std::atomic<bool> failed{false};
};

// Waits for `work`; with a watch of a recovering group, gives up (throws, and marks the
// generation failed) once the agent says a rank of this generation died.
void await_work(c10d::Work& work, GenerationWatch* watch);

c10d::ReduceOp to_c10d(ReduceOp op);  // kAvg: SUM (the caller divides)

struct ProcessGroup::Impl {
  WorkerEnv env;
  Backend backend = Backend::kGloo;
  c10::Device device = c10::Device(c10::kCPU);
  c10::intrusive_ptr<c10d::Store> default_pg;  // below every generation's prefix
  c10::intrusive_ptr<c10d::Store> user_store;
  compat::BackendPtr pg;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> barrier_store;  // barrier(timeout) meets here
  int64_t barrier_round = 0;

  // In-process recovery (training_loop.hpp): the agent's channel, this generation's watch, and
  // whether this process is a replacement still waiting for the training state.
  std::optional<detail::RecoveryChannel> recovery;
  std::shared_ptr<GenerationWatch> watch = std::make_shared<GenerationWatch>();
  bool awaiting_state = false;

  Work submit(c10::intrusive_ptr<c10d::Work> w, std::function<void()> finish = {});
  void await(const c10::intrusive_ptr<c10d::Work>& w) { await_work(*w, watch.get()); }

  // The store and the backend of generation `g` (0: the first, as Python's default group).
  void open_generation(int g, bool python_init_steps);
};

}  // namespace ddprun
