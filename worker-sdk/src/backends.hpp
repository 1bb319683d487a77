// Factories for the c10d backends, each in its own translation unit so that Gloo's and NCCL's
// headers stay out of the rest of the SDK. Internal.
#pragma once

#include <chrono>

#include "compat.hpp"

namespace ddprun::detail {

compat::BackendPtr make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::chrono::milliseconds timeout);

// Whether the SDK was compiled with NCCL (a CUDA LibTorch); the factory below throws otherwise.
bool nccl_compiled();
// Number of CUDA devices visible (0 in a CPU-only build).
int cuda_device_count();
// Makes `device_index` the current CUDA device and creates the NCCL backend.
compat::BackendPtr make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, int device_index, std::chrono::milliseconds timeout);

}  // namespace ddprun::detail
