// Every difference between the LibTorch versions the SDK builds against (Debian's 1.13 and the
// 2.x inside PyPI wheels) lives in this file, gated on TORCH_VERSION_MAJOR/MINOR. Internal:
// included by the SDK's .cpp files only.
//
// Sections that need heavy headers are opt-in: define DDPRUN_COMPAT_GLOO before including this
// file to get the Gloo helpers (and Gloo's headers).
#pragma once

#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <chrono>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "ddprun/env.hpp"

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#define DDPRUN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||         \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace ddprun::compat {

// The object collectives are issued on. From 2.0 ProcessGroupGloo/ProcessGroupNCCL derive from
// c10d::Backend, and the ProcessGroup wrapper's constructor keeps changing within 2.x; before,
// they were c10d::ProcessGroup themselves.
#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif
using BackendPtr = c10::intrusive_ptr<BackendBase>;

// The owner of a gradient accumulator: std::shared_ptr<Node> in 1.x, c10::intrusive_ptr<Node>
// in 2.x. The accumulator must be kept alive: a parameter only holds a weak reference.
using GradAccumulatorPtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

// LibTorch 1.13's ProcessGroupGloo cannot all-reduce bfloat16 ("Invalid scalar type").
constexpr bool kGlooReducesBFloat16 = TORCH_VERSION_MAJOR >= 2;

// What a rank that joined (Join, uneven inputs) contributes to the per-iteration all-reduce of
// used parameters with find_unused_parameters. PyTorch 1.13 sends zeros. PyTorch 2.x sends the
// result of the previous such all-reduce (it reduces a device copy in place and sends that copy
// again), so a parameter that any rank used in the joined rank's last iteration counts as used
// from then on: its .grad becomes zeros instead of staying untouched, which moves it when the
// optimizer has momentum and .grad was set to none. The SDK does what its LibTorch's Python does.
constexpr bool kJoinedRankResendsUsage = TORCH_VERSION_MAJOR >= 2;

inline c10::intrusive_ptr<c10d::TCPStore> connect_tcp_store(const WorkerEnv& env, bool is_server,
                                                            std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(env.master_port);
  opts.isServer = is_server;
  opts.numWorkers = static_cast<std::size_t>(env.world_size);
  opts.waitWorkers = true;  // as Python's TCPStore(..., wait_for_workers=True)
  opts.timeout = timeout;
  opts.multiTenant = is_server;
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
}

// The store Python's init_process_group("env://") builds over the TCPStore, *before* it adds
// its own "default_pg" prefix (torch/distributed/rendezvous.py, _create_c10d_store).
inline c10::intrusive_ptr<c10d::Store> rendezvous_store(c10::intrusive_ptr<c10d::Store> tcp,
                                                        const WorkerEnv& env) {
#if TORCH_VERSION_MAJOR >= 2
  (void)env;  // 2.x: the agent serves a fresh store per attempt; no attempt prefix.
  return tcp;
#else
  if (env.use_agent_store) {
    return c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + std::to_string(env.restart_count), std::move(tcp));
  }
  return tcp;
#endif
}

// The store the default group's backend is created on, from the "default_pg" store
// (distributed_c10d.py, _new_process_group_helper). PrefixStore joins with "/", so 2.x keys look
// like "default_pg/0//cpu//<key>".
inline c10::intrusive_ptr<c10d::Store> backend_store(c10::intrusive_ptr<c10d::Store> default_pg,
                                                     bool cuda_backend) {
#if TORCH_VERSION_MAJOR >= 2
  auto group = c10::make_intrusive<c10d::PrefixStore>("0/", std::move(default_pg));
  // The backend is registered under the first device of its capability list: gloo ["cpu",
  // "cuda"], nccl ["cuda"].
  return c10::make_intrusive<c10d::PrefixStore>(cuda_backend ? "cuda/" : "cpu/", std::move(group));
#else
  (void)cuda_backend;
  return c10::make_intrusive<c10d::PrefixStore>("0", std::move(default_pg));
#endif
}

// What Python does after creating the default group. 1.13: a store-based barrier on the
// "default_pg" store, then rank 0 publishes the group's sequence number. 2.x: nothing unless
// TORCH_DIST_INIT_BARRIER=1, which we do not mirror.
inline void after_default_group_init(const c10::intrusive_ptr<c10d::Store>& default_pg,
                                     BackendBase& backend, int world_size,
                                     std::chrono::milliseconds timeout) {
#if TORCH_VERSION_MAJOR >= 2
  (void)default_pg, (void)backend, (void)world_size, (void)timeout;
#else
  // Python's _store_based_barrier: a counter polled with add(key, 0). The protocol offers no
  // event to wait on (a Python peer never sets a "done" key), so poll as Python does.
  const std::string key = "store_based_barrier_key:1";
  default_pg->add(key, 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto delay = std::chrono::milliseconds(1);
  while (default_pg->add(key, 0) != world_size) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw Error("timed out after " + std::to_string(timeout.count()) + " ms waiting for all " +
                  std::to_string(world_size) + " workers to join the process group");
    }
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, std::chrono::milliseconds(10));
  }
  backend.setSequenceNumberForGroup();
#endif
}

}  // namespace ddprun::compat

#ifdef DDPRUN_COMPAT_GLOO
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <cstdlib>
#include <sstream>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace ddprun::compat {

// The Gloo options Python's ProcessGroupGloo(store, rank, size, timeout) constructor uses:
// devices from GLOO_SOCKET_IFNAME (comma-separated interfaces) or the host name's address, and
// two threads per device. 2.x packs this into Options::create_default. Only opaque
// shared_ptr<gloo::transport::Device> cross into LibTorch: the 2.x wheels link their own Gloo
// and ship no Gloo headers, so we compile against Debian's (older) ones.
inline c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> gloo_options(
    std::chrono::milliseconds timeout) {
#if TORCH_VERSION_MAJOR >= 2
  return c10d::ProcessGroupGloo::Options::create_default(timeout);
#else
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  const char* ifnames = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifnames != nullptr && *ifnames != '\0') {
    std::stringstream list(ifnames);
    for (std::string name; std::getline(list, name, ',');) {
      if (!name.empty()) {
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
      }
    }
  }
  if (options->devices.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  options->threads = static_cast<int>(options->devices.size() * 2);
  return options;
#endif
}

}  // namespace ddprun::compat
#endif  // DDPRUN_COMPAT_GLOO
