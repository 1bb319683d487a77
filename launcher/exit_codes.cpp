#include "launcher/exit_codes.hpp"

namespace ddprun::launcher {

int exit_code(const agent::JobResult& result) {
  using Kind = agent::JobResult::Kind;
  switch (result.kind) {
    case Kind::kSucceeded:
      return kExitSuccess;
    case Kind::kWorkersFailed: {
      // No root cause here: it was another node's worker. A failed job never exits 0, even if
      // the agent were to hand over a successful status.
      int code = result.root_cause ? result.root_cause->shell_code() : kExitFailure;
      return code == kExitSuccess ? kExitFailure : code;
    }
    case Kind::kWorkerHung:
      return kExitHang;
    case Kind::kSignaled:
      return result.signal > 0 ? kExitSignalBase + result.signal : kExitFailure;
    case Kind::kRendezvousFailed:
    case Kind::kStoreLost:
    case Kind::kStartFailed:
      return kExitFailure;
  }
  return kExitFailure;  // a Kind this table does not know yet
}

}  // namespace ddprun::launcher
