// What the training loop (training_loop.hpp) needs of a ProcessGroup to recover in process:
// whether its generation failed, and a rebuild of its backend for the next generation over the
// same store. Internal.
#pragma once

#include <optional>

#include "ddprun/process_group.hpp"
#include "recovery_channel.hpp"

namespace ddprun::detail {

class GroupRecovery {
 public:
  // The agent's channel, when the job recovers in process (DDPRUN_RECOVERY_DIR).
  static const std::optional<RecoveryChannel>& channel(const ProcessGroup& group);
  // A collective of the running generation failed, or was abandoned on the agent's notice.
  static bool failed(const ProcessGroup& group);
  // A transport of the SDK's own over the group's ranks (shared memory) failed: as above.
  static void mark_failed(ProcessGroup& group);
  // A replacement that has not yet received the training state from a survivor.
  static bool awaiting_state(const ProcessGroup& group);
  static void state_received(ProcessGroup& group);
  // The backend of `generation`, made over the same store under that generation's prefix; the
  // old one is abandoned (never destroyed: a thread of it may wait forever in a collective
  // with the dead rank, and its destructor would join that thread).
  static void rebuild(ProcessGroup& group, int generation);
};

}  // namespace ddprun::detail
