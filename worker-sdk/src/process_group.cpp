#include "ddprun/process_group.hpp"

#include <ATen/ATen.h>

#include <mutex>

#include "ddprun/heartbeat.hpp"
#include "group_recovery.hpp"
#include "process_group_impl.hpp"
#include "standby.hpp"
#include "work_impl.hpp"

namespace ddprun {

// ---------------------------------------------------------------------------------------------
// Work

namespace {

// How often a wait looks for the agent's notice that a rank died. A survivor whose peers are
// alive but wait in the same collective as it would otherwise wait out the group's timeout.
constexpr std::chrono::milliseconds kNoticePoll{50};

}  // namespace

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

namespace {

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

namespace {

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

Work ProcessGroup::Impl::submit(c10::intrusive_ptr<c10d::Work> w, std::function<void()> finish) {
  auto impl = std::make_shared<C10dWork>();
  impl->work = std::move(w);
  impl->watch = watch;
  impl->finish = std::move(finish);
  return Work(std::move(impl));
}

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
