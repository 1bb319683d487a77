#include "recovery_channel.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace ddprun::detail {
namespace {

// A small decimal number from `path`; 0 when it is missing or not one.
int read_number(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[32];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  return std::atoi(buf);
}

}  // namespace

std::optional<RecoveryChannel> RecoveryChannel::from_env() {
  const char* dir = std::getenv("DDPRUN_RECOVERY_DIR");
  if (dir == nullptr || *dir == '\0') return std::nullopt;
  const char* joined = std::getenv("DDPRUN_RECOVERY_GENERATION");
  return RecoveryChannel(dir, joined ? std::max(0, std::atoi(joined)) : 0);
}

int RecoveryChannel::notice() const {
  return read_number(dir_ + "/generation");
}

std::optional<int> RecoveryChannel::await_notice(int current,
                                                 std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (int g = notice(); g > current) return g;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void RecoveryChannel::announce_ready(int rank, int generation) const {
  const std::string path = dir_ + "/ready/" + std::to_string(rank);
  const std::string tmp = path + ".tmp";
  const std::string text = std::to_string(generation) + "\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;  // the agent then restarts the group instead: nothing is lost
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (ok) ::rename(tmp.c_str(), path.c_str());
}

}  // namespace ddprun::detail
