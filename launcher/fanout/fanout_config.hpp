// FanoutConfig: the flags of a launch over ssh (`--hosts`/`--hostfile`; launcher/README.md,
// "How the fan-out works"). Pure data, filled by the CLI parser; the fan-out
// plan (fanout_plan.hpp) checks how it combines with the other flags.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

struct FanoutConfig {
  std::string hosts;                // --hosts: "node1,node2"
  std::string hostfile;             // --hostfile: "host slots=N" lines
  std::string include;              // --include: "host1@host2:0,2"
  std::string exclude;              // --exclude: the same syntax
  std::string ssh_command = "ssh";  // program and leading words, split like a shell
  std::string ssh_options;          // more words for ssh, split like a shell
  std::optional<int> ssh_port;
  double ssh_connect_timeout = 10;   // seconds: ssh's ConnectTimeout and the probe's budget
  std::string remote_ddprun;         // empty: this ddprun's own absolute path
  std::vector<std::string> exports;  // --export: NAME or NAME=VALUE
  // Set on the remote side: EOF on stdin (the ssh channel closed) stops the job as SIGTERM.
  bool stop_on_stdin_eof = false;

  bool active() const { return !hosts.empty() || !hostfile.empty(); }
};

// Applies one fan-out value flag; false for a name that is not one. Throws CliError for a bad
// value, naming `source` ("--ssh-port" or "PET_SSH_PORT").
bool apply_fanout_value(FanoutConfig& c, const std::string& name, const std::string& value,
                        const std::string& source);

// The flags only the launching ddprun reads (never forwarded to the remote ones).
bool is_fanout_flag(std::string_view name);

}  // namespace ddprun::launcher
