// The health endpoints' observer: keeps what /healthz, /metrics and /status report (the group's
// state, the running attempt's workers, their exits and hangs, why the group is unhealthy) from
// what the loop reports, and serves them over HTTP (--health-port; health/http_server.hpp).
// The counts come from JobSummary, the heartbeats from the hang monitor's watchdog.
#pragma once

#include <boost/asio/io_context.hpp>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "agent/agent_observer.hpp"
#include "agent/health/http_server.hpp"
#include "agent/job_status.hpp"
#include "agent/job_summary.hpp"
#include "agent/memory_checkpoints.hpp"

namespace ddprun::agent {

class StatusObserver final : public AgentObserver {
 public:
  // `summary` and `*watchdog` (null: no heartbeats) must outlive this.
  StatusObserver(std::string job_id, const JobSummary& summary, const Watchdog* watchdog)
      : job_id_(std::move(job_id)), summary_(summary), watchdog_(watchdog) {}

  // Starts serving on host:port; throws std::system_error naming the endpoint. Returns the port.
  int serve(boost::asio::io_context& io, const std::string& host, int port);
  // Stops serving (before the watchdog goes).
  void stop_serving() { server_.reset(); }
  // The job's in-memory checkpoints, whose use /status and /metrics show (null: none). It must
  // outlive this.
  void set_memory_checkpoints(const MemoryCheckpoints* memory) { memory_ = memory; }

  JobStatus snapshot() const;
  HttpResponse respond(std::string_view target) const;

  void on_state(WorkerState state) override { state_ = state; }
  void on_round(const RendezvousInfo& round, Millis took) override;
  void on_attempt(const RendezvousInfo& round, const std::vector<StartedWorker>& workers) override;
  void on_worker_exit(const ExitedWorker& exit) override;
  void on_worker_replaced(const RendezvousInfo& round, const StartedWorker& worker,
                          int generation) override;
  void on_hang_found(const Hang& hang, int rank) override;
  void on_collective_judged(const CollectiveVerdict& verdict, int attempt) override;
  void on_exit_hang(const StartedWorker& worker, const std::string& why, const StackDump& stacks,
                    int attempt) override;
  void on_transition(WorkerState from, const Decision& d, const Observed& seen,
                     const RendezvousInfo& round) override;

 private:
  WorkerStatus worker_status(const StartedWorker& w,
                             std::chrono::steady_clock::time_point now) const;
  // `s.reason` and `s.healthy` from the group's state and its workers.
  void judge_health(JobStatus& s) const;

  std::string job_id_;
  const MemoryCheckpoints* memory_ = nullptr;
  const JobSummary& summary_;
  const Watchdog* watchdog_;
  std::unique_ptr<HealthServer> server_;

  WorkerState state_ = WorkerState::kInit;
  RendezvousInfo round_;
  std::vector<StartedWorker> workers_;  // the running attempt's
  std::map<int, ExitedWorker> exits_;   // by local rank
  std::set<int> hung_;                  // local ranks found hung
  std::set<int> exit_hung_;             // stopped after --exit-timeout: their work was done
  // The first cause noted in a round: a hang's description outlives the transition and the
  // stop that follow it.
  std::string unhealthy_reason_;
  std::string hang_diagnosis_;  // kept across attempts: the last one
};

}  // namespace ddprun::agent
