// In-process recovery as a worker sees it: the directory the agent and the workers of one
// attempt share (DDPRUN_RECOVERY_DIR, set by `ddprun --in-process-recovery`). Internal.
//
//   <dir>/generation     the agent's notice: the group generation the workers are to rebuild
//                        to ("2\n"), written atomically (a temp file renamed over it)
//   <dir>/ready/<RANK>   a worker's answer: the generation its training loop runs in
//
// A worker started as a replacement also gets DDPRUN_RECOVERY_GENERATION: it joins that
// generation's process group directly and receives the training state from a survivor.
// agent/in_process_recovery.hpp is the agent's side.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace ddprun::detail {

class RecoveryChannel {
 public:
  // Nullopt when the job does not recover in process (no DDPRUN_RECOVERY_DIR).
  static std::optional<RecoveryChannel> from_env();

  // DDPRUN_RECOVERY_GENERATION: the generation a replacement joins (0: a first start).
  int joined_generation() const { return joined_; }
  // The generation the agent announced last (0 before any).
  int notice() const;
  // Waits (polling every millisecond or so) until the agent announces a generation above
  // `current`; nullopt after `timeout`.
  std::optional<int> await_notice(int current, std::chrono::milliseconds timeout) const;
  // Tells the agent that `rank` runs its training loop in `generation`.
  void announce_ready(int rank, int generation) const;

 private:
  RecoveryChannel(std::string dir, int joined) : dir_(std::move(dir)), joined_(joined) {}
  std::string dir_;
  int joined_ = 0;
};

}  // namespace ddprun::detail
