// Uneven inputs: ranks that run out of data keep answering the others' collectives, as with
// PyTorch's torch.distributed.algorithms.Join (and DistributedDataParallel.join()).
//
//   ddprun::DistributedDataParallel ddp(net, pg);
//   ddprun::join({&ddp}, [&] {
//     for (auto& [x, y] : my_batches) {      // may be fewer on some ranks than on others
//       opt.zero_grad();
//       loss_fn(ddp(x), y).backward();
//       opt.step();
//     }
//   });                                      // every rank's model is the same again here
//
// Without it, a rank with one batch more than another waits forever in its all-reduce.
// While the body runs, each forward of a joinable DDP tells the others that this rank is still
// training (one small all-reduce per forward). A rank whose body returned runs, per iteration
// the others still do, the collectives of that iteration with zero gradients ("shadowing"), so
// its contribution to their average is zero. When every rank is done, the model (parameters and
// buffers) of the rank that finished last (the highest such rank) is broadcast to all.
//
// Gradients are divided by the initial world size by default, as in PyTorch: a joined rank
// counts as a zero gradient. With divide_by_initial_world_size = false they are divided by the
// number of ranks still training instead. throw_on_early_termination makes every rank throw
// ddprun::Error as soon as one of them runs out of data (for jobs that prefer to stop).
//
// If the body throws, the exception propagates at once and nothing is shadowed (as PyTorch's
// context manager does): the other ranks will then fail or hang in their next collective.
#pragma once

#include <functional>
#include <vector>

#include "ddprun/process_group.hpp"

namespace ddprun {

class Join;

// What the ranks still training do in one iteration, as a joined rank learns it.
struct JoinRound {
  int training = 0;        // ranks still training
  bool grad_enabled = false;  // some forward of this iteration ran with grad mode on
  bool sync = false;       // and its backward reduces gradients (not under no_sync)
};

// Something whose collectives a joined rank must shadow (DistributedDataParallel is one).
class Joinable {
 public:
  virtual ~Joinable() = default;
  // The collectives of one iteration of the ranks still training, with this rank's share zero.
  virtual void join_shadow(const JoinRound& round) = 0;
  // Every rank is done; `is_last_joiner`: this rank's body returned after everyone else's (or
  // together with the last ones).
  virtual void join_finish(bool is_last_joiner) = 0;
  virtual ProcessGroup& join_process_group() = 0;

 protected:
  friend class Join;
  // The Join this joinable runs under, null outside one. Only the first joinable of a Join
  // notifies it (once per forward).
  Join* join_ = nullptr;
  bool join_notifies_ = false;
};

struct JoinOptions {
  bool divide_by_initial_world_size = true;
  bool throw_on_early_termination = false;
};

class Join {
 public:
  // The joinables must share one process group and outlive the Join.
  explicit Join(std::vector<Joinable*> joinables, JoinOptions options = {});
  ~Join();  // detaches; does not shadow (call finish())
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // After this rank's last iteration: shadows the others until every rank finished, then runs
  // each joinable's join_finish. Collective.
  void finish();

  // Called by a joinable's forward (the first joinable's only): this rank is still training.
  // Returns the number of ranks still training in this iteration. Throws ddprun::Error when
  // throw_on_early_termination is set and a rank has finished.
  int notify(bool grad_enabled, bool sync);

  const JoinOptions& options() const { return options_; }

 private:
  std::vector<Joinable*> joinables_;
  JoinOptions options_;
  ProcessGroup& group_;
  bool finished_ = false;
};

// Runs `body` (this rank's training loop) under a Join of `joinables`, then finish().
void join(std::vector<Joinable*> joinables, const std::function<void()>& body,
          JoinOptions options = {});

}  // namespace ddprun
