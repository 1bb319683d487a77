// File descriptors: their one owner (UniqueFd), pipes, files opened for writing, and writes
// that finish. Every descriptor ddprun opens outside Boost.Asio is held by a UniqueFd.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <utility>

namespace ddprun::sys {

// Closes its descriptor on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

// A close-on-exec pipe; throws std::system_error.
Pipe make_pipe();

// Opens `path` for writing (created, truncated or with `append` after its end, close-on-exec);
// throws std::system_error naming the path.
UniqueFd open_for_write(const char* path, bool append = false);

// Writes all of `data` to `fd`, retrying on EINTR/EAGAIN. Returns false if the fd is gone
// (EPIPE, EBADF...): console output to a closed pipe is dropped, never fatal.
bool write_all(int fd, const char* data, size_t size);

}  // namespace ddprun::sys
