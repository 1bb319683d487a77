// Heartbeats to the ddprun agent (`ddprun --hang-timeout=SEC`, docs/hangs-health-events.md).
//
// The SDK beats on its own after every completed collective (Work::wait, barrier, all_gather)
// and at the end of every synchronised backward pass of DistributedDataParallel, so a C++
// worker is watched with no code of its own. Call ddprun::heartbeat() yourself in loops that
// run no collective for long (data loading, evaluation on one rank, checkpointing).
//
// A beat is one datagram to the agent's socket, $DDPRUN_HEARTBEAT_SOCKET; the agent knows the
// sender by its pid. Without that variable (not under ddprun) it does nothing. It never
// blocks: a beat the agent cannot take is dropped. Beats closer than 10 ms to the previous
// one are skipped, so calling it in a hot loop costs one clock read.
#pragma once

namespace ddprun {

void heartbeat() noexcept;

}  // namespace ddprun
