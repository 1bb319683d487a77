#include "launcher/fanout/fanout_result.hpp"

#include <signal.h>

#include "store/sys/signal_names.hpp"

namespace ddprun::launcher {
namespace {

std::string describe(const NodeEnd& e) {
  std::string how = e.status.describe();
  if (e.status.kind == agent::ExitStatus::Kind::kExited && e.status.value == 255) {
    how += " (ssh failed: connection refused or lost, or authentication)";
  }
  return "node " + std::to_string(e.node_rank) + " (" + e.host + ") " + how;
}

// What telling a node to stop makes it end with: SIGTERM's 143 from the remote ddprun, or
// death by our SIGKILL of its ssh. A stopped node that ended otherwise was already ending on
// its own (its worker failed while the stop was on its way) and still counts.
bool ended_by_our_stop(const NodeEnd& e) {
  return e.stopped && (e.status.kind == agent::ExitStatus::Kind::kSignaled ||
                       e.status.shell_code() == 128 + SIGTERM);
}

}  // namespace

FanoutResult fanout_result(const std::vector<NodeEnd>& ends, std::optional<int> signal) {
  if (signal) {
    return {128 + *signal, "received " + sys::signal_name(*signal) + ": every node was stopped"};
  }
  const NodeEnd* first = nullptr;  // the first to fail on its own
  const NodeEnd* other = nullptr;  // the first to fail on its own with a code other than 1
  for (const auto& e : ends) {
    if (e.status.success() || ended_by_our_stop(e)) continue;
    if (!first) first = &e;
    if (!other && e.status.shell_code() != 1) other = &e;
  }
  const NodeEnd* root = other ? other : first;
  if (!root) {
    for (const auto& e : ends) {
      if (!e.status.success()) return {e.status.shell_code(), "job failed: " + describe(e)};
    }
    return {0, ""};
  }
  return {root->status.shell_code(),
          "job failed: " + describe(*root) + "; the others were stopped"};
}

}  // namespace ddprun::launcher
