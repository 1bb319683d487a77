// HangMonitor: the agent's part that finds hung workers and explains them. It owns the watchdog
// (heartbeats and torch's FileTimer, agent/hang/) and the runtime directory its socket and FIFO
// live in, remembers this attempt's hangs, and takes the stacks of the workers involved (the
// hung one, the silent peers of a collective hang, the workers still running --exit-timeout
// after another exited 0). The loop decides what a hang means (a failure, or nothing when the
// group is already stopping); the monitor only reports and explains.
//
// Threads: the io_context thread only.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "agent/agent_observer.hpp"
#include "agent/failure.hpp"
#include "agent/hang/collective_judge.hpp"
#include "agent/hang/watchdog.hpp"
#include "agent/process/process_context.hpp"
#include "agent/worker_group.hpp"
#include "agent/worker_spec.hpp"
#include "store/sys/temp_dir.hpp"

namespace ddprun::agent {

// The running attempt, as the monitor sees it.
struct AttemptView {
  const WorkerGroup& group;
  ProcessContext& processes;
  std::string log_dir;  // attempt_<N>/: stacks go to <local_rank>/stacks.txt
};

class HangMonitor {
 public:
  // Opens the heartbeat socket (and the FileTimer FIFO when spec.file_timer) in a runtime
  // directory of its own; `on_hang` is called (posted) for every hang the watchdog finds.
  // Throws std::exception when they cannot be made.
  HangMonitor(boost::asio::io_context& io, const WorkerSpec& spec,
              std::function<void(const Hang&)> on_hang);

  // What the workers get as DDPRUN_HEARTBEAT_SOCKET and TORCHELASTIC_TIMER_FILE.
  AgentEndpoints endpoints() const;
  const Watchdog& watchdog() const { return *watchdog_; }

  // A new attempt: forgets the last one's hangs and judges these workers.
  void watch(std::vector<WatchedWorker> workers);
  void worker_exited(int local_rank) { watchdog_->worker_exited(local_rank); }
  void unwatch() { watchdog_->unwatch(); }

  // A hang the loop acts on: its stacks are taken by capture().
  void found(const Hang& hang) { pending_.push_back(hang); }
  bool any_found() const { return !pending_.empty(); }

  // Takes the stacks of every hang found (and sends a FileTimer scope's signal), then those of
  // the node's other workers silent for half the hang timeout: in a collective hang the first
  // rank reported need not be the culprit. Local ranks with stacks go into `reported`. The
  // workers are asked for their flight recorders first, and answer meanwhile.
  boost::asio::awaitable<void> capture(const AttemptView& attempt, const Observers& observers,
                                       std::set<int>& reported);
  // Which of `failures` died of a collective's own timeout (gloo's "Timed out waiting ...",
  // NCCL's "Watchdog caught collective operation timeout" in its error file or stderr): each is
  // placed inside a collective for the judgement. Returns whether any did.
  bool note_collective_timeouts(const std::vector<ProcessFailure>& failures);
  // Another node reported a hung worker, or a worker here died of a collective's timeout: this
  // node's part of the evidence, the stacks of its silent workers and the flight recorders of
  // all.
  boost::asio::awaitable<void> capture_for_peer(const AttemptView& attempt);
  // This node's evidence for the collective judgement: every worker's flight-recorder answer
  // (awaited until all answered, at most kTraceWait after the request) and where its stacks
  // placed it.
  boost::asio::awaitable<std::vector<RankEvidence>> local_evidence(const AttemptView& attempt);
  // Judges the collective from every node's evidence (collective_judge.hpp); the line goes to
  // the console, the observers and this attempt's hung failures.
  void judge(const AttemptView& attempt, const std::vector<RankEvidence>& evidence,
             const Observers& observers);
  // The workers still running --exit-timeout after another exited 0: their stacks, logged and
  // reported; returns their local ranks (the loop stops them).
  boost::asio::awaitable<std::set<int>> capture_exit_hangs(const AttemptView& attempt,
                                                           const Observers& observers);
  // How long the workers' flight-recorder answers are awaited after the stacks (a worker that
  // does not run the responder never answers).
  static constexpr std::chrono::milliseconds kTraceWait{1000};

  // The hung workers of this attempt as failures (after the stop), with their stacks; every
  // failure gets the collective judgement, if any.
  void add_failures(const AttemptView& attempt, std::vector<ProcessFailure>& failures) const;

 private:
  struct Hung {
    Hang hang;
    StackDump stacks;
    int64_t unix_time = 0;  // when it was found
  };

  boost::asio::awaitable<StackDump> stacks_of(pid_t pid, const AttemptView& attempt,
                                              int local_rank);
  boost::asio::awaitable<void> capture_silent_peers(const AttemptView& attempt);
  // Asks every running worker for its flight recorder (a new request file).
  void request_traces(const AttemptView& attempt);

  boost::asio::io_context& io_;
  const WorkerSpec& spec_;
  sys::TempDir runtime_dir_;
  std::unique_ptr<Watchdog> watchdog_;
  std::vector<Hang> pending_;         // found, stacks not taken yet
  std::vector<Hung> hung_;            // this attempt's, with their stacks
  std::map<int, StackPlace> places_;  // local rank -> where its stacks placed it
  std::set<int> timed_out_;           // local ranks that died of a collective's timeout
  std::chrono::steady_clock::time_point requested_;
  CollectiveVerdict verdict_;  // this attempt's collective judgement (line empty: none)
};

// "rank 3 (local rank 1, pid 4133)": how log lines name a worker.
std::string worker_name(const Worker& w, pid_t pid);

}  // namespace ddprun::agent
