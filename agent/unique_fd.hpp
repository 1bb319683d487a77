// File descriptors the agent owns (store::UniqueFd), and the pipes and files it creates.
#pragma once

#include <cstddef>

#include "store/unique_fd.hpp"

namespace ddprun::agent {

using store::UniqueFd;

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

// A close-on-exec pipe; throws std::system_error.
Pipe make_pipe();

// Opens `path` for writing (created, truncated, close-on-exec); throws std::system_error
// naming the path.
UniqueFd open_for_write(const char* path);

// Writes all of `data` to `fd`, retrying on EINTR/EAGAIN. Returns false if the fd is gone
// (EPIPE, EBADF...): console output to a closed pipe is dropped, never fatal.
bool write_all(int fd, const char* data, size_t size);

}  // namespace ddprun::agent
