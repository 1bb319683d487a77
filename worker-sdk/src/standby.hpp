// A standby worker (ddprun --in-process-recovery; agent/process/standby.hpp): a process started
// ahead of need that waits, in init_process_group(), for a dead worker's place. Internal.
#pragma once

namespace ddprun::detail {

// Under DDPRUN_STANDBY_FD: blocks until the agent hands this process a worker's environment
// (which replaces this one's) and its stdout/stderr (dup'd onto 1 and 2), then returns; exits
// 0 when the agent closes the socket instead. Without it: returns at once.
void become_worker_if_standby();

}  // namespace ddprun::detail
