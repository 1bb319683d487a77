// Gloo, isolated: the only file that sees Gloo's headers (see compat.hpp for why that matters
// with the 2.x wheels).
#define DDPRUN_COMPAT_GLOO
#include "backends.hpp"

namespace ddprun::detail {

compat::BackendPtr make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::chrono::milliseconds timeout) {
  auto options = compat::gloo_options(timeout);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

}  // namespace ddprun::detail
