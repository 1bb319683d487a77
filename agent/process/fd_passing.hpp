// One message and a few descriptors over a Unix socket (SCM_RIGHTS): how the agent hands a
// worker's log descriptors to a process it did not spawn for that worker (the warm-start
// zygote, an in-process recovery standby).
#pragma once

#include <string_view>
#include <vector>

namespace ddprun::agent {

// Sends `bytes` with `fds` attached as one message on `socket` (retries EINTR, no SIGPIPE).
// False with errno set when it failed.
bool send_with_fds(int socket, std::string_view bytes, const std::vector<int>& fds);

}  // namespace ddprun::agent
