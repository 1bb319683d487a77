// How a launch over ssh ended, from how each node's ssh ended: the launcher's exit code and
// its last line. A pure function (table-tested in fanout_result_test.cpp).
//
// Rules:
//  * ddprun got signal N: 128 + N, whatever the nodes did.
//  * every node exited 0: 0.
//  * else the failing node is the first, in exit order, to fail on its own (not ending with
//    what the launcher's stop causes: 143, or its ssh killed) with a code other than 1; a node that
//    exits 1 is usually saying "the job failed on another node" (launcher/README.md, "Exit codes"),
//    so it is the failing node only when no node failed otherwise. The launcher exits with its code
//    (as a shell reports it; 255 is ssh's own failure).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/process/exit_status.hpp"

namespace ddprun::launcher {

struct NodeEnd {
  std::string host;
  int node_rank = 0;
  agent::ExitStatus status;
  bool stopped = false;  // the launcher had told it to stop before it ended
};

struct FanoutResult {
  int code = 0;
  std::string line;  // empty on success
};

// `ends` in the order the nodes ended.
FanoutResult fanout_result(const std::vector<NodeEnd>& ends, std::optional<int> signal);

}  // namespace ddprun::launcher
