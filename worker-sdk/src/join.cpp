// The Join protocol. One all-reduce of four integers per iteration carries everything a joined
// rank needs: [ranks still training, of them with grad mode on, of them reducing gradients,
// joined ranks asking everyone to stop]. A rank still training sends [1, g, s, 0] from its
// forward; a joined rank sends [0, 0, 0, t] from finish() and then shadows what g and s say.
#include "ddprun/join.hpp"

#include <ATen/ATen.h>

#include <string>

namespace ddprun {
namespace {

at::Tensor round_tensor(ProcessGroup& group, int training, int grad_enabled, int sync, int stop) {
  at::Tensor t = at::tensor({training, grad_enabled, sync, stop}, at::kInt).to(group.device());
  group.all_reduce(t);
  return t.cpu();
}

}  // namespace

Join::Join(std::vector<Joinable*> joinables, JoinOptions options)
    : joinables_(std::move(joinables)),
      options_(options),
      group_([&]() -> ProcessGroup& {
        if (joinables_.empty() || joinables_.front() == nullptr) {
          throw Error("Join: needs at least one joinable (e.g. a DistributedDataParallel)");
        }
        return joinables_.front()->join_process_group();
      }()) {
  for (Joinable* j : joinables_) {
    if (j == nullptr) throw Error("Join: a joinable is null");
    if (&j->join_process_group() != &group_) {
      throw Error("Join: every joinable must use the same process group");
    }
    if (j->join_ != nullptr) throw Error("Join: a joinable is under another Join already");
  }
  for (Joinable* j : joinables_) {
    j->join_ = this;
    j->join_notifies_ = j == joinables_.front();
  }
}

Join::~Join() {
  for (Joinable* j : joinables_) {
    j->join_ = nullptr;
    j->join_notifies_ = false;
  }
}

int Join::notify(bool grad_enabled, bool sync) {
  if (finished_) throw Error("Join: a forward after finish()");
  at::Tensor t = round_tensor(group_, 1, grad_enabled ? 1 : 0, sync ? 1 : 0, 0);
  const int* v = t.data_ptr<int>();
  if (v[3] > 0) {
    throw Error("Join (rank " + std::to_string(group_.rank()) + "): " + std::to_string(v[3]) +
                " rank(s) ran out of inputs and throw_on_early_termination is set; stopping "
                "on every rank");
  }
  return v[0];
}

void Join::finish() {
  if (finished_) throw Error("Join::finish called twice");
  finished_ = true;
  bool is_last_joiner = true;
  const int stop = options_.throw_on_early_termination ? 1 : 0;
  for (;;) {
    at::Tensor t = round_tensor(group_, 0, 0, 0, stop);
    const int* v = t.data_ptr<int>();
    if (v[0] == 0) break;  // nobody is training any more
    if (stop) {
      throw Error("Join (rank " + std::to_string(group_.rank()) +
                  "): this rank ran out of inputs while " + std::to_string(v[0]) +
                  " rank(s) were still training, and throw_on_early_termination is set");
    }
    JoinRound round{v[0], v[1] > 0, v[2] > 0};
    for (Joinable* j : joinables_) j->join_shadow(round);
    is_last_joiner = false;
  }
  for (Joinable* j : joinables_) j->join_finish(is_last_joiner);
}

void join(std::vector<Joinable*> joinables, const std::function<void()>& body,
          JoinOptions options) {
  Join j(std::move(joinables), options);
  body();
  j.finish();
}

}  // namespace ddprun
