// Joining the job and talking to the other workers.
//
//   auto pg = ddprun::init_process_group();   // from RANK, WORLD_SIZE, MASTER_ADDR, ...
//   torch::Device device = pg->device();      // cuda:LOCAL_RANK with NCCL, else cpu
//   pg->all_reduce(t);                        // sum, in place, on every rank
//
// A ProcessGroup owns the store client and the c10d backend (Gloo for CPU tensors, NCCL for
// CUDA tensors when the SDK is built against a CUDA LibTorch). Collectives must be called in the
// same order on every rank. One thread at a time may issue collectives (as with c10d); Work
// handles may be waited on from any thread.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "ddprun/env.hpp"

namespace ddprun {

namespace detail {
class GroupRecovery;
}

enum class Backend {
  kAuto,  // NCCL when built with CUDA support and a CUDA device is present, else Gloo
  kGloo,
  kNccl,
};

enum class ReduceOp { kSum, kAvg, kMin, kMax, kProduct };

// "gloo", "nccl", "auto" -> Backend; throws ddprun::Error for anything else.
Backend parse_backend(std::string_view name);
// Whether this SDK was built against a CUDA LibTorch with NCCL.
bool nccl_available();

struct InitOptions {
  Backend backend = Backend::kAuto;
  // Store connection, rendezvous and collective timeout (Python's default: 30 minutes).
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
};

// A pending collective. Copyable handle; wait() may be called more than once.
class Work {
 public:
  Work() = default;  // an empty handle: wait() returns at once
  // Blocks until the collective finished (for NCCL: until the current CUDA stream is ordered
  // after it). Throws ddprun::Error or c10::Error when it failed.
  void wait();
  bool completed() const;

  struct Impl;  // the SDK's (c10d work, or its own transport's)
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Impl> impl_;
};

class ProcessGroup {
 public:
  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  Backend backend() const;
  std::string backend_name() const;  // "gloo" or "nccl"
  // The device this worker computes on: cuda:LOCAL_RANK for NCCL, cpu for Gloo.
  c10::Device device() const;
  // The environment the group was made from (a synthetic one for new_process_group()).
  const WorkerEnv& env() const;
  // The store the group's backend uses, below its key prefixes (free for user keys).
  c10::intrusive_ptr<c10d::Store> store() const;
  // The timeout collectives and the store run under (InitOptions::timeout).
  std::chrono::milliseconds timeout() const;
  // How many times the group was rebuilt in place after a rank died (in-process recovery,
  // training_loop.hpp); 0 for a group that never was. A process started as a replacement
  // begins at the generation it joins: it has no training state until its TrainingLoop runs,
  // so it skips what the others did before theirs (see training_loop.hpp).
  int generation() const;

  // In-place collectives. The blocking forms return when the result is in `tensor`.
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  Work all_reduce_async(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  void broadcast(at::Tensor& tensor, int root = 0);
  Work broadcast_async(at::Tensor& tensor, int root = 0);
  // Every rank's `tensor` (same shape and dtype on all ranks), indexed by rank.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  // Reduces every rank's `tensor` (same shape and dtype on all ranks) into `dst`'s, in place,
  // like Python's dist.reduce. Only `dst`'s tensor holds the result afterwards; the others'
  // contents are unspecified (the backend may use them as scratch). kAvg divides the sum on
  // `dst` (floor division for integer tensors, as all_reduce does).
  void reduce(at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::kSum);
  void barrier();
  // A barrier that gives up: throws ddprun::Error naming the timeout and the ranks that did not
  // arrive when not every rank reaches it within `timeout`. It meets on the store, not in the
  // backend, so a failed barrier leaves no collective in flight; it pairs only with other
  // barrier(timeout) calls (Python's dist.barrier is the backend's barrier()).
  void barrier(std::chrono::milliseconds timeout);

  // Every rank's bytes, indexed by rank; lengths may differ (metrics, names, serialized objects).
  std::vector<std::string> all_gather_bytes(std::string_view bytes);
  // Root's bytes on every rank (`bytes` is ignored on the others).
  std::string broadcast_bytes(std::string_view bytes, int root = 0);
  // Every rank's bytes on `dst`, indexed by rank; an empty vector on the other ranks.
  std::vector<std::string> gather_bytes(std::string_view bytes, int dst = 0);

 private:
  friend class detail::GroupRecovery;
  std::unique_ptr<Impl> impl_;
};

// Joins the job described by the environment (see env.hpp): connects to the store at
// MASTER_ADDR:MASTER_PORT under the key prefixes PyTorch's init_process_group("env://") uses
// for the same LibTorch version (so C++ and Python workers can share one job), and creates the
// backend. Throws ddprun::Error naming the variable when the environment is incomplete.
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});

// A group over an existing store (tests, custom rendezvous). Every rank passes the same store
// contents and a distinct rank in [0, size).
std::shared_ptr<ProcessGroup> new_process_group(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                int size, const InitOptions& options = {});

}  // namespace ddprun
