// OwnedPath: the one owner of a filesystem name this process created (a bound socket, a FIFO).
// It remembers the file's identity (device, inode) when adopted and unlinks the name on
// destruction only if the name still points at that file, so an owner never removes a file
// that someone else has put at the same path since.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <utility>

namespace ddprun::agent {

class OwnedPath {
 public:
  OwnedPath() = default;
  // Takes ownership of the file now at `path` (nothing is owned if it cannot be stat'ed).
  explicit OwnedPath(std::string path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return;
    path_ = std::move(path);
    dev_ = st.st_dev;
    ino_ = st.st_ino;
  }
  OwnedPath(OwnedPath&& other) noexcept { *this = std::move(other); }
  OwnedPath& operator=(OwnedPath&& other) noexcept {
    if (this != &other) {
      reset();
      path_ = std::exchange(other.path_, {});
      dev_ = other.dev_;
      ino_ = other.ino_;
    }
    return *this;
  }
  OwnedPath(const OwnedPath&) = delete;
  OwnedPath& operator=(const OwnedPath&) = delete;
  ~OwnedPath() { reset(); }

  const std::string& path() const { return path_; }
  explicit operator bool() const { return !path_.empty(); }

  void reset() {
    if (path_.empty()) return;
    struct stat st {};
    if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) {
      ::unlink(path_.c_str());
    }
    path_.clear();
  }

 private:
  std::string path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace ddprun::agent
