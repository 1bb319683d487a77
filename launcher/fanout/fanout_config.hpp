// FanoutConfig: the flags of a launch over ssh (`--hosts`/`--hostfile`; launcher/README.md,
// "How the fan-out works"). Pure data, filled by the CLI parser from the flag table
// (flags.hpp); the fan-out plan (fanout_plan.hpp) checks how it combines with the other flags.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher {

struct FanoutConfig {
  std::string hosts;        // --hosts: "node1,node2"
  std::string hostfile;     // --hostfile: "host slots=N" lines
  std::string include;      // --include: "host1@host2:0,2"
  std::string exclude;      // --exclude: the same syntax
  std::string ssh_command;  // program and leading words, split like a shell
  std::string ssh_options;  // more words for ssh, split like a shell
  std::optional<int> ssh_port;
  std::chrono::milliseconds ssh_connect_timeout{0};  // ssh's ConnectTimeout, the probe's budget
  std::string remote_ddprun;                         // empty: this ddprun's own absolute path
  std::vector<std::string> exports;                  // --export: NAME or NAME=VALUE
  // Set on the remote side: EOF on stdin (the ssh channel closed) stops the job as SIGTERM.
  bool stop_on_stdin_eof = false;

  bool active() const { return !hosts.empty() || !hostfile.empty(); }
};

}  // namespace ddprun::launcher
