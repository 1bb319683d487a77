#include "agent/rendezvous/settings.hpp"

namespace ddprun::agent {

std::string_view backend_name(Backend backend) {
  switch (backend) {
    case Backend::kStatic:
      return "static";
    case Backend::kC10d:
      return "c10d";
    case Backend::kEtcd:
      return "etcd";
  }
  return "?";
}

}  // namespace ddprun::agent
