#include "ddprun/process_group.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "backends.hpp"
#include "compat.hpp"
#include "ddprun/heartbeat.hpp"
#include "group_recovery.hpp"
#include "standby.hpp"
#include "work_impl.hpp"

namespace ddprun {

// ---------------------------------------------------------------------------------------------
// Work

namespace {

// One generation of a group, as its collectives' waits see it (in-process recovery only).
struct GenerationWatch {
  const detail::RecoveryChannel* channel = nullptr;  // null: plain waits
  int generation = 0;
  std::atomic<bool> failed{false};
};

// How often a wait looks for the agent's notice that a rank died. A survivor whose peers are
// alive but wait in the same collective as it would otherwise wait out the group's timeout.
constexpr std::chrono::milliseconds kNoticePoll{50};

void await_work(c10d::Work& work, GenerationWatch* watch) {
  if (watch == nullptr || watch->channel == nullptr) {
    work.wait();
    return;
  }
  try {
    for (;;) {
      try {
        work.wait(kNoticePoll);  // throws when it failed, or when the poll's time is up
        return;
      } catch (const std::exception&) {
        if (work.isCompleted()) throw;  // the collective failed (a peer's connection closed)
      }
      if (watch->channel->notice() > watch->generation) {
        throw Error("collective abandoned: a rank of process group generation " +
                    std::to_string(watch->generation) +
                    " died and ddprun is replacing it (in-process recovery)");
      }
    }
  } catch (...) {
    watch->failed = true;
    throw;
  }
}

struct C10dWork : Work::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  std::shared_ptr<GenerationWatch> watch;
  std::function<void()> finish;  // runs once, after the first successful wait (e.g. AVG's divide)
  std::once_flag finished;

  void wait() override {
    await_work(*work, watch.get());
    heartbeat();
    if (finish) std::call_once(finished, finish);
  }
  bool completed() override { return work->isCompleted(); }
};

}  // namespace

void Work::wait() {
  if (impl_) impl_->wait();
}

bool Work::completed() const {
  return !impl_ || impl_->completed();
}

// ---------------------------------------------------------------------------------------------
// ProcessGroup

struct ProcessGroup::Impl {
  WorkerEnv env;
  Backend backend = Backend::kGloo;
  c10::Device device = c10::Device(c10::kCPU);
  c10::intrusive_ptr<c10d::Store> default_pg;  // below every generation's prefix
  c10::intrusive_ptr<c10d::Store> user_store;
  compat::BackendPtr pg;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> barrier_store;  // barrier(timeout) meets here
  int64_t barrier_round = 0;

  // In-process recovery (training_loop.hpp): the agent's channel, this generation's watch, and
  // whether this process is a replacement still waiting for the training state.
  std::optional<detail::RecoveryChannel> recovery;
  std::shared_ptr<GenerationWatch> watch = std::make_shared<GenerationWatch>();
  bool awaiting_state = false;

  Work submit(c10::intrusive_ptr<c10d::Work> w, std::function<void()> finish = {}) {
    auto impl = std::make_shared<C10dWork>();
    impl->work = std::move(w);
    impl->watch = watch;
    impl->finish = std::move(finish);
    return Work(std::move(impl));
  }
  void await(const c10::intrusive_ptr<c10d::Work>& w) { await_work(*w, watch.get()); }

  // The store and the backend of generation `g` (0: the first, as Python's default group).
  void open_generation(int g, bool python_init_steps);
};

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kProduct:
      return c10d::ReduceOp::PRODUCT;
  }
  throw Error("unknown ReduceOp");
}

Backend resolve_backend(Backend requested) {
  if (requested != Backend::kAuto) return requested;
  return detail::nccl_compiled() && detail::cuda_device_count() > 0 ? Backend::kNccl
                                                                    : Backend::kGloo;
}

// Generation 0 sits where Python's default group does; each rebuilt one (in-process recovery)
// under a prefix of its own, so that no key of a failed generation is ever read again.
c10::intrusive_ptr<c10d::Store> generation_store(const c10::intrusive_ptr<c10d::Store>& default_pg,
                                                 int generation) {
  if (generation == 0) return default_pg;
  return c10::make_intrusive<c10d::PrefixStore>("ddprun_generation_" + std::to_string(generation),
                                                default_pg);
}

std::shared_ptr<ProcessGroup> make_group(WorkerEnv env,
                                         const c10::intrusive_ptr<c10d::Store>& default_pg,
                                         const InitOptions& options, bool python_init_steps) {
  auto impl = std::make_unique<ProcessGroup::Impl>();
  impl->timeout = options.timeout;
  impl->backend = resolve_backend(options.backend);
  impl->default_pg = default_pg;
  impl->env = std::move(env);
  const bool nccl = impl->backend == Backend::kNccl;
  if (nccl) {
    const int devices = detail::cuda_device_count();
    if (!detail::nccl_compiled()) {
      detail::make_nccl_backend(default_pg, impl->env.rank, impl->env.world_size, 0,
                                options.timeout);
    }
    if (impl->env.local_rank >= devices) {
      throw Error("backend nccl: LOCAL_RANK=" + std::to_string(impl->env.local_rank) +
                  " but only " + std::to_string(devices) +
                  " CUDA device(s) are visible; run one worker per GPU (--nproc_per_node) or "
                  "use gloo");
    }
    impl->device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(impl->env.local_rank));
  }
  // Only the process group of the worker's environment recovers in process, over Gloo (an
  // NCCL communicator cannot be abandoned the way a Gloo context can).
  int generation = 0;
  if (python_init_steps && !nccl) {
    impl->recovery = detail::RecoveryChannel::from_env();
    if (impl->recovery) generation = impl->recovery->joined_generation();
  }
  impl->awaiting_state = generation > 0;
  impl->user_store = c10::make_intrusive<c10d::PrefixStore>("ddprun_user", default_pg);
  impl->open_generation(generation, python_init_steps && generation == 0);
  return std::make_shared<ProcessGroup>(std::move(impl));
}

}  // namespace

void ProcessGroup::Impl::open_generation(int g, bool python_init_steps) {
  const bool nccl = backend == Backend::kNccl;
  auto store = generation_store(default_pg, g);
  auto backend_store = compat::backend_store(store, nccl);
  pg = nccl ? detail::make_nccl_backend(backend_store, env.rank, env.world_size, env.local_rank,
                                        timeout)
            : detail::make_gloo_backend(backend_store, env.rank, env.world_size, timeout);
  barrier_store = c10::make_intrusive<c10d::PrefixStore>(
      g == 0 ? std::string("ddprun_barrier") : "ddprun_barrier_" + std::to_string(g), default_pg);
  barrier_round = 0;
  watch = std::make_shared<GenerationWatch>();
  watch->channel = recovery ? &*recovery : nullptr;
  watch->generation = g;
  if (python_init_steps) {
    compat::after_default_group_init(default_pg, *pg, env.world_size, timeout);
  }
}

namespace detail {

const std::optional<RecoveryChannel>& GroupRecovery::channel(const ProcessGroup& group) {
  return group.impl_->recovery;
}

bool GroupRecovery::failed(const ProcessGroup& group) {
  return group.impl_->watch->failed;
}

void GroupRecovery::mark_failed(ProcessGroup& group) {
  group.impl_->watch->failed = true;
}

bool GroupRecovery::awaiting_state(const ProcessGroup& group) {
  return group.impl_->awaiting_state;
}

void GroupRecovery::state_received(ProcessGroup& group) {
  group.impl_->awaiting_state = false;
}

void GroupRecovery::rebuild(ProcessGroup& group, int generation) {
  // Leaked on purpose (see group_recovery.hpp): a few threads and buffers per recovery.
  static auto* abandoned = new std::vector<compat::BackendPtr>();
  abandoned->push_back(std::move(group.impl_->pg));
  group.impl_->open_generation(generation, /*python_init_steps=*/false);
}

}  // namespace detail

Backend parse_backend(std::string_view name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "gloo") return Backend::kGloo;
  if (name == "nccl") return Backend::kNccl;
  throw Error("unknown backend \"" + std::string(name) + "\" (expected gloo, nccl or auto)");
}

bool nccl_available() {
  return detail::nccl_compiled();
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const {
  return impl_->env.rank;
}
int ProcessGroup::size() const {
  return impl_->env.world_size;
}
Backend ProcessGroup::backend() const {
  return impl_->backend;
}
std::string ProcessGroup::backend_name() const {
  return impl_->backend == Backend::kNccl ? "nccl" : "gloo";
}
c10::Device ProcessGroup::device() const {
  return impl_->device;
}
const WorkerEnv& ProcessGroup::env() const {
  return impl_->env;
}
c10::intrusive_ptr<c10d::Store> ProcessGroup::store() const {
  return impl_->user_store;
}
std::chrono::milliseconds ProcessGroup::timeout() const {
  return impl_->timeout;
}

int ProcessGroup::generation() const {
  return impl_->watch->generation;
}

Work ProcessGroup::all_reduce_async(at::Tensor& tensor, ReduceOp op) {
  const bool native_avg = impl_->backend == Backend::kNccl;
  c10d::AllreduceOptions opts;
  opts.reduceOp =
      (op == ReduceOp::kAvg && native_avg) ? c10d::ReduceOp(c10d::ReduceOp::AVG) : to_c10d(op);
  std::vector<at::Tensor> tensors{tensor};
  auto w = impl_->pg->allreduce(tensors, opts);
  if (op == ReduceOp::kAvg && !native_avg) {
    const int n = size();
    at::Tensor t = tensor;
    return impl_->submit(std::move(w), [t, n]() mutable {
      if (t.is_floating_point() || t.is_complex()) {
        t.div_(n);
      } else {
        t.div_(n, "floor");
      }
    });
  }
  return impl_->submit(std::move(w));
}

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  all_reduce_async(tensor, op).wait();
}

Work ProcessGroup::broadcast_async(at::Tensor& tensor, int root) {
  if (root < 0 || root >= size()) {
    throw Error("broadcast: root " + std::to_string(root) + " is not a rank of this group");
  }
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.rootTensor = 0;
  std::vector<at::Tensor> tensors{tensor};
  return impl_->submit(impl_->pg->broadcast(tensors, opts));
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  broadcast_async(tensor, root).wait();
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  at::Tensor input = tensor.contiguous();
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < size(); ++i) outputs[0].push_back(at::empty_like(input));
  std::vector<at::Tensor> inputs{input};
  impl_->await(impl_->pg->allgather(outputs, inputs));
  heartbeat();
  return outputs[0];
}

void ProcessGroup::reduce(at::Tensor& tensor, int dst, ReduceOp op) {
  if (dst < 0 || dst >= size()) {
    throw Error("reduce: dst " + std::to_string(dst) + " is not a rank of this group");
  }
  c10d::ReduceOptions opts;
  opts.reduceOp = to_c10d(op);  // kAvg: a sum, divided on dst below
  opts.rootRank = dst;
  opts.rootTensor = 0;
  std::vector<at::Tensor> tensors{tensor};
  impl_->await(impl_->pg->reduce(tensors, opts));
  heartbeat();
  if (op == ReduceOp::kAvg && rank() == dst) {
    if (tensor.is_floating_point() || tensor.is_complex()) {
      tensor.div_(size());
    } else {
      tensor.div_(size(), "floor");
    }
  }
}

void ProcessGroup::barrier(std::chrono::milliseconds timeout) {
  auto& store = *impl_->barrier_store;
  const std::string round = std::to_string(impl_->barrier_round++);
  // Reaching round r means every rank finished waiting in round r - 2: its keys are garbage.
  if (rank() == 0 && impl_->barrier_round > 2) {
    const std::string old = std::to_string(impl_->barrier_round - 3);
    store.deleteKey(old + "/done");
    store.deleteKey(old + "/count");
    for (int r = 0; r < size(); ++r) store.deleteKey(old + "/" + std::to_string(r));
  }
  store.set(round + "/" + std::to_string(rank()), std::vector<uint8_t>{1});
  if (store.add(round + "/count", 1) == size()) {
    store.set(round + "/done", std::vector<uint8_t>{1});
  } else {
    try {
      store.wait({round + "/done"}, timeout);
    } catch (const std::exception& e) {
      std::string missing;
      for (int r = 0; r < size(); ++r) {
        bool arrived = true;
        try {
          arrived = store.check({round + "/" + std::to_string(r)});
        } catch (const std::exception&) {
        }
        if (!arrived) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw Error("barrier timed out after " + std::to_string(timeout.count()) + " ms on rank " +
                  std::to_string(rank()) +
                  "; rank(s) not arrived: " + (missing.empty() ? "unknown" : missing));
    }
  }
  heartbeat();
}

void ProcessGroup::barrier() {
  if (impl_->backend == Backend::kNccl) {
    // ProcessGroupNCCL's barrier guesses a device; a one-element all-reduce on ours is exact.
    at::Tensor t = at::zeros({1}, at::TensorOptions().device(impl_->device));
    all_reduce(t);
    t.cpu();
    return;
  }
  impl_->await(impl_->pg->barrier());
  heartbeat();
}

std::vector<std::string> ProcessGroup::all_gather_bytes(std::string_view bytes) {
  const auto on_device = at::TensorOptions().device(impl_->device);
  at::Tensor len = at::full({1}, static_cast<int64_t>(bytes.size()), on_device.dtype(at::kLong));
  std::vector<at::Tensor> lens = all_gather(len);
  std::vector<int64_t> sizes;
  int64_t max_len = 0;
  for (const auto& l : lens) {
    sizes.push_back(l.cpu().item<int64_t>());
    max_len = std::max(max_len, sizes.back());
  }
  at::Tensor buf = at::zeros({std::max<int64_t>(max_len, 1)}, at::kByte);
  std::memcpy(buf.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  std::vector<at::Tensor> parts = all_gather(buf.to(impl_->device));
  std::vector<std::string> out;
  for (size_t r = 0; r < parts.size(); ++r) {
    at::Tensor cpu = parts[r].cpu();
    out.emplace_back(reinterpret_cast<const char*>(cpu.data_ptr<uint8_t>()),
                     static_cast<size_t>(sizes[r]));
  }
  return out;
}

std::string ProcessGroup::broadcast_bytes(std::string_view bytes, int root) {
  const auto on_device = at::TensorOptions().device(impl_->device);
  const bool is_root = rank() == root;
  at::Tensor len = at::full({1}, is_root ? static_cast<int64_t>(bytes.size()) : int64_t{0},
                            on_device.dtype(at::kLong));
  broadcast(len, root);
  const int64_t n = len.cpu().item<int64_t>();
  at::Tensor buf = at::zeros({std::max<int64_t>(n, 1)}, at::kByte);
  if (is_root) std::memcpy(buf.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  at::Tensor dev = buf.to(impl_->device);
  broadcast(dev, root);
  at::Tensor cpu = dev.cpu();
  return std::string(reinterpret_cast<const char*>(cpu.data_ptr<uint8_t>()),
                     static_cast<size_t>(n));
}

std::vector<std::string> ProcessGroup::gather_bytes(std::string_view bytes, int dst) {
  if (dst < 0 || dst >= size()) {
    throw Error("gather_bytes: dst " + std::to_string(dst) + " is not a rank of this group");
  }
  // As Python's gather_object: every rank learns the longest length, then a padded gather.
  const auto on_device = at::TensorOptions().device(impl_->device);
  at::Tensor len = at::full({1}, static_cast<int64_t>(bytes.size()), on_device.dtype(at::kLong));
  std::vector<int64_t> sizes;
  int64_t max_len = 1;
  for (const auto& l : all_gather(len)) {
    sizes.push_back(l.cpu().item<int64_t>());
    max_len = std::max(max_len, sizes.back());
  }
  at::Tensor buf = at::zeros({max_len}, at::kByte);
  std::memcpy(buf.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  std::vector<at::Tensor> inputs{buf.to(impl_->device)};
  std::vector<std::vector<at::Tensor>> outputs;
  if (rank() == dst) {
    outputs.emplace_back();
    for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  }
  c10d::GatherOptions opts;
  opts.rootRank = dst;
  impl_->await(impl_->pg->gather(outputs, inputs, opts));
  heartbeat();
  std::vector<std::string> out;
  if (rank() != dst) return out;
  for (size_t r = 0; r < outputs[0].size(); ++r) {
    at::Tensor cpu = outputs[0][r].cpu();
    out.emplace_back(reinterpret_cast<const char*>(cpu.data_ptr<uint8_t>()),
                     static_cast<size_t>(sizes[r]));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Creation

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  detail::become_worker_if_standby();  // a standby returns as the worker whose place it took
  WorkerEnv env = read_worker_env();
  // With the agent's store every worker is a client; otherwise rank 0 hosts the store, as with
  // Python's init_process_group("env://") outside torchelastic.
  const bool host = !env.use_agent_store && env.rank == 0;
  c10::intrusive_ptr<c10d::Store> tcp;
  try {
    tcp = compat::connect_tcp_store(env, host, options.timeout);
  } catch (const std::exception& e) {
    throw Error("cannot " + std::string(host ? "host" : "reach") +
                " the store at MASTER_ADDR=" + env.master_addr +
                " MASTER_PORT=" + std::to_string(env.master_port) + ": " + e.what());
  }
  auto store = compat::rendezvous_store(tcp, env);
  store->setTimeout(options.timeout);
  auto default_pg = c10::make_intrusive<c10d::PrefixStore>("default_pg", store);
  return make_group(std::move(env), default_pg, options, /*python_init_steps=*/true);
}

std::shared_ptr<ProcessGroup> new_process_group(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                int size, const InitOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error("new_process_group: rank " + std::to_string(rank) + " is not in [0, " +
                std::to_string(size) + ")");
  }
  WorkerEnv env;
  env.rank = rank;
  env.world_size = size;
  env.local_rank = rank;
  env.local_world_size = size;
  auto default_pg = c10::make_intrusive<c10d::PrefixStore>("default_pg", std::move(store));
  return make_group(std::move(env), default_pg, options, /*python_init_steps=*/false);
}

}  // namespace ddprun
