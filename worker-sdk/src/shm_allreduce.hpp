// Same-host all-reduce through shared memory, for DistributedDataParallel's CPU buckets.
//
// Gloo moves every byte through loopback TCP; when all ranks share a host (and its IPC and PID
// namespaces), the buckets can live in one shared mapping instead: each rank's gradients sit in
// its own slot, each rank sums a 1/world slice across all slots and writes the sum back into
// every slot. That is about 2x the bucket's bytes of memory traffic per rank, several times
// cheaper than the TCP path on a small machine (tests/bench/README.md has figures).
//
// One worker thread per transport runs the operations in submission order, which is the same on
// every rank. Ranks synchronise with a barrier of atomics in the mapping (futex waits, no
// spinning); a waiting rank watches its peers through pidfds, so a peer that dies (SIGKILL)
// makes the operation fail instead of hanging. Internal.
#pragma once

#include <ATen/Tensor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ddprun/process_group.hpp"

namespace ddprun {

class PromiseWork;

class ShmAllReduce {
 public:
  // Collective over `group` (every rank calls it): maps a segment with `slot_bytes` per rank.
  // Returns nullptr on every rank when any rank cannot take part (another host or namespace, no
  // room in /dev/shm, DDPRUN_SHM=0, ...); the caller then uses the process group.
  static std::unique_ptr<ShmAllReduce> create(ProcessGroup& group, int64_t slot_bytes);
  ~ShmAllReduce();  // finishes queued operations, stops the worker
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  // A CPU tensor over `numel` elements at byte `offset` of this rank's slot; it keeps the mapping
  // alive. `dtype` must be kFloat or kDouble.
  at::Tensor slot_tensor(int64_t offset, int64_t numel, at::ScalarType dtype);

  // Sums the region [offset, offset + numel elements) across all ranks' slots, in place, after
  // the calling thread's writes to it. Operations run in submission order.
  Work all_reduce(int64_t offset, int64_t numel, at::ScalarType dtype);

  struct Segment;  // the mapping and its control block

 private:
  struct Op {
    int64_t offset, numel;
    at::ScalarType dtype;
    std::shared_ptr<PromiseWork> work;
  };
  ShmAllReduce(std::shared_ptr<Segment> segment, int rank, int world, std::vector<int> peer_pidfds,
               std::vector<int> peer_pids, std::chrono::milliseconds timeout);
  void run();
  void execute(const Op& op);
  void barrier();
  void check_peers();

  std::shared_ptr<Segment> segment_;
  int rank_, world_;
  std::vector<int> pidfds_;  // owned; -1 where a peer is watched by pid only
  std::vector<int> pids_;
  std::chrono::milliseconds timeout_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool stopping_ = false;
  std::atomic<bool> abandon_{false};  // the owner is going away: stop waiting for peers
  std::thread worker_;
};

}  // namespace ddprun
