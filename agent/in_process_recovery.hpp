// In-process recovery, the agent's side (--in-process-recovery; the workers' side is the worker
// SDK's TrainingLoop, worker-sdk/include/ddprun/training_loop.hpp). When a worker dies and every
// other worker of the job runs a TrainingLoop, its agent starts only the dead worker again; the
// others keep their processes, rebuild their process group with it, and hand it the training
// state. Each such rebuild is a *generation* (1, 2, ...) of the attempt's group. Across nodes
// the agents agree on generations through the rendezvous (RendezvousHandler::restart_in_place
// and on_peer_recovery): the other nodes' agents *follow* the one that replaces a worker.
//
// The agent and the workers share one directory per attempt (DDPRUN_RECOVERY_DIR):
//
//   generation     the agent's notice, written (atomically) before the replacement starts:
//                  the generation every worker is to rebuild its group to
//   ready/<RANK>   each worker's answer: the generation its TrainingLoop runs in (-1 or
//                  missing: not in a loop, so it cannot recover in process)
//
// The replacement gets DDPRUN_RECOVERY_GENERATION as well. The agent only reads and writes
// files here: the state machine (state_machine.hpp, RECOVERING) decides.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace ddprun::agent {

class InProcessRecovery {
 public:
  using Clock = std::chrono::steady_clock;

  // Creates `dir` (the attempt's) and its ready/ directory. Throws std::system_error.
  explicit InProcessRecovery(std::string dir);

  const std::string& dir() const { return dir_; }
  int generation() const { return generation_; }
  bool recovering() const { return recovering_; }

  // Whether every one of `ranks` has announced that its TrainingLoop runs the current
  // generation (so it can rebuild its group when another rank dies).
  bool ready(const std::vector<int>& ranks) const;
  // Announces the next generation for the replacement of `failed` ranks; returns it.
  int begin(const std::vector<int>& failed);
  // Another node replaces its workers in `generation`: this node's workers are to rebuild to
  // it (the notice, as begin() writes it, with nothing to replace here).
  void follow(int generation);
  // While recovering: whether every one of `ranks` runs the new generation (then it is over).
  bool complete(const std::vector<int>& ranks);
  // How long the running recovery has taken (zero when none runs).
  std::chrono::milliseconds elapsed() const;
  const std::vector<int>& replaced() const { return replaced_; }

 private:
  void announce(int generation);  // writes the notice
  std::string dir_;
  int generation_ = 0;
  bool recovering_ = false;
  Clock::time_point began_{};
  std::vector<int> replaced_;
};

}  // namespace ddprun::agent
