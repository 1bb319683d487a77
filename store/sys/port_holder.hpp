// Who holds a TCP port: for the error a user sees when a store cannot listen ("port 29500 is
// held by pid 4133: python3 train.py"). Reads /proc/net/tcp and tcp6 for a socket listening
// on the port, then /proc/<pid>/fd of each process for that socket's inode. Only processes
// this user may look into are seen (root sees all); the scan is bounded (it stops after
// kMaxProcesses processes) and runs only on that error path.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace ddprun::sys {

struct PortHolder {
  pid_t pid = 0;        // 0: a listener was found, but not its process (another user's)
  std::string command;  // its command line, spaces between the arguments, at most 120 chars
};

// The process listening on TCP `port` (any address), if one is to be seen.
std::optional<PortHolder> find_port_holder(int port, const std::string& proc = "/proc");

// " (port 29500 is held by pid 4133: python3 train.py)", " (a process of another user
// listens on port 29500)", or "" when nothing is seen listening there.
std::string port_holder_text(int port);

}  // namespace ddprun::sys
