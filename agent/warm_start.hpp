// WarmStart: the agent's part that keeps a warm-start zygote (process/zygote.hpp) for a Python
// entrypoint and forks the workers from it once it is ready.
//
// The zygote starts with the agent and imports while the rendezvous runs; every attempt, the
// first included, waits for it (up to kReadyWait) and forks its workers from it, so a script
// sees the same start at every attempt. The zygote never runs a worker's code itself, so one
// serves every attempt. A zygote that died or broke is replaced in the background and that
// attempt starts cold; after three that failed one after another, warm start is off for the
// job. One log line says when a zygote is ready and what it holds, one why an attempt starts
// cold.
//
// Threads: the io_context thread only.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/process/process_context.hpp"
#include "agent/process/zygote.hpp"
#include "agent/worker_spec.hpp"

namespace ddprun::agent {

class WarmStart {
 public:
  // `spec` (spec.warm_start and spec.python set) must outlive this. The zygote writes its
  // output to <log_dir>/zygote.log; `guardian` (may be null) kills it if ddprun dies.
  WarmStart(const WorkerSpec& spec, std::string log_dir, std::vector<int> reset_signals,
            Guardian* guardian);
  ~WarmStart();

  // How long an attempt waits for a zygote that is still importing before it starts cold.
  static constexpr std::chrono::seconds kReadyWait{120};

  // Completes once the zygote is ready or failed, after kReadyWait, or when `stop` says so (a
  // signal): polled every few milliseconds on the calling coroutine's executor.
  boost::asio::awaitable<void> wait_until_settled(std::function<bool()> stop);

  // For ProcessContext::start: forks from the zygote when it is ready (else nullopt: cold).
  // Call once per attempt, after wait_until_settled() and after the previous attempt's
  // processes are gone.
  ProcessContext::WarmSpawn spawner();

  // The zygotes' pids (the current one and those retired).
  std::vector<pid_t> pids() const;

 private:
  void start_zygote();
  bool usable();   // ready, or not; logs what changed
  bool settled();  // ready, failed, or none: nothing to wait for
  std::optional<ChildProcess> spawn(const WorkerLaunch& launch, int stdout_fd, int stderr_fd);

  const WorkerSpec& spec_;
  std::string log_dir_;
  std::vector<int> reset_signals_;
  Guardian* guardian_;
  std::unique_ptr<Zygote> zygote_;
  // Zygotes replaced while their workers may still need them to be reaped: kept until the
  // next attempt starts.
  std::vector<std::unique_ptr<Zygote>> retired_;
  int started_ = 0;  // zygotes started
  int failed_in_a_row_ = 0;
  bool announced_ = false;   // this zygote's ready line went out
  bool cold_noted_ = false;  // this attempt's "still importing" line went out
  std::string cwd_;
};

}  // namespace ddprun::agent
