// The check before anything starts: every host at once, `ssh ... -n HOST "cd CWD || exit 3;
// test -x DDPRUN || exit 4"` under BatchMode and ConnectTimeout, all of it bounded by the
// connect timeout plus a margin (a host that accepts the connection and then says nothing).
// Blocks the calling thread on its own io_context; starts nothing that outlives it.
#pragma once

#include <string>
#include <vector>

#include "launcher/fanout/fanout_plan.hpp"

namespace ddprun::launcher {

struct Unreachable {
  std::string host;
  std::string why;  // "ssh: connect to host ... Connection refused", "no answer within 10 s"
};

// `ssh_program` is the resolved path of the probe argv's first word.
std::vector<Unreachable> probe_hosts(const FanoutPlan& plan, const std::string& ssh_program);

// "cannot reach 2 of 3 hosts over ssh: a (why); b (why)": the one line of the error.
std::string unreachable_line(const std::vector<Unreachable>& bad, size_t hosts);

}  // namespace ddprun::launcher
