// NCCL, compiled only against a CUDA LibTorch (DDPRUN_WITH_NCCL in the generated sdk_config.hpp);
// elsewhere the factory reports that NCCL is unavailable.
#include "backends.hpp"
#include "sdk_config.hpp"

#ifdef DDPRUN_WITH_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace ddprun::detail {

#ifdef DDPRUN_WITH_NCCL

bool nccl_compiled() {
  return true;
}

int cuda_device_count() {
  return static_cast<int>(c10::cuda::device_count());
}

compat::BackendPtr make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, int device_index,
                                     std::chrono::milliseconds timeout) {
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}

#else

bool nccl_compiled() {
  return false;
}

int cuda_device_count() {
  return 0;
}

compat::BackendPtr make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int, int,
                                     std::chrono::milliseconds) {
  throw Error(
      "backend nccl: this ddprun SDK was built against a LibTorch without CUDA/NCCL; use gloo "
      "or rebuild the SDK against a CUDA LibTorch");
}

#endif

}  // namespace ddprun::detail
