// run_fanout: the launching ddprun of `--hosts`/`--hostfile`. Probes every host (one error
// line and exit 1 if any cannot be reached, nothing started), then starts one ssh per node
// running that node's ddprun (fanout_plan.hpp) and streams each node's output to ours,
// "HOST: " before every line, stdout to stdout and stderr to stderr.
//
// Ending (each node is told to stop by closing its ssh's stdin; fanout_result.hpp decides the
// exit code):
//   * every node exited 0                  -> exit 0
//   * a node exited non-zero               -> the other nodes are stopped; one line names the
//                                             failing host and its code, which is ours
//   * SIGINT/SIGTERM/SIGHUP/SIGQUIT        -> every node is stopped; exit 128 + N. A second
//                                             signal kills the ssh clients at once (the remote
//                                             ddprun still sees EOF and stops its workers)
//   * a node still running --shutdown-timeout + close_timeout (--rdzv-conf, 30 s: how long
//     the store's host waits for the others' goodbyes) + 10 s after being told to stop: its
//     ssh is killed (the remote ddprun has had its EOF and ends on its own)
#pragma once

#include "launcher/fanout/fanout_plan.hpp"

namespace ddprun::launcher {

// Runs the job to the end on the calling thread; returns ddprun's exit code.
int run_fanout(const FanoutPlan& plan, const GetEnv& getenv);

}  // namespace ddprun::launcher
