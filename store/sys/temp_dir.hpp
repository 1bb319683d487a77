// TempDir: a private directory that lives as long as its owner (mode 0700, removed with
// everything in it on destruction). The agent keeps its heartbeat socket and timer FIFO in
// one, short enough for a Unix socket path (108 bytes).
#pragma once

#include <string>

namespace ddprun::sys {

class TempDir {
 public:
  TempDir() = default;
  // Creates <$TMPDIR or /tmp>/<prefix>XXXXXX. Throws std::system_error naming the path.
  explicit TempDir(const std::string& prefix);
  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::string& path() const { return path_; }
  explicit operator bool() const { return !path_.empty(); }

 private:
  void remove();
  std::string path_;
};

}  // namespace ddprun::sys
