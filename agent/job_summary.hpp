// JobSummary: the job's counts on this node (attempts, restarts, re-formations, hangs, wall
// time), their one owner, and the summary line every job ends with:
//   [ddprun] host:pid job summary: 2 attempts, 1 restart, 0 re-formations, 1 hang, wall time 14.2 s
// The event log and the health endpoints read the counts from here.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "agent/agent_observer.hpp"

namespace ddprun::agent {

class JobSummary final : public AgentObserver {
 public:
  using Clock = std::chrono::steady_clock;
  using Now = std::function<Clock::time_point()>;

  // `now`: the clock (tests inject one); the agent's start is when this is constructed.
  explicit JobSummary(Now now = &Clock::now) : now_(std::move(now)), started_(now_()) {}

  uint64_t attempts() const { return attempts_; }
  uint64_t reformations() const { return reformations_; }
  uint64_t hangs() const { return hangs_; }
  int restarts() const { return round_.restart_count; }
  Millis round_took() const { return round_took_; }
  double uptime_s() const { return std::chrono::duration<double>(now_() - started_).count(); }

  void on_round(const RendezvousInfo& round, Millis took) override {
    round_ = round;
    round_took_ = took;
  }
  void on_attempt(const RendezvousInfo&, const std::vector<StartedWorker>&) override {
    ++attempts_;
  }
  void on_hang_found(const Hang&, int) override { ++hangs_; }
  void on_worker_replaced(const RendezvousInfo& round, const StartedWorker&, int) override {
    round_ = round;
  }
  void on_transition(WorkerState, const Decision& d, const Observed&,
                     const RendezvousInfo&) override {
    if (d.action == Action::kReform) ++reformations_;
  }
  void on_job_end(const JobResult& result, const RendezvousInfo& round) override;

 private:
  Now now_;
  Clock::time_point started_;
  RendezvousInfo round_;
  Millis round_took_{0};
  uint64_t attempts_ = 0;
  uint64_t reformations_ = 0;
  uint64_t hangs_ = 0;
};

}  // namespace ddprun::agent
