#include "agent/in_process_recovery.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <system_error>

namespace ddprun::agent {
namespace {

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    throw std::system_error(errno, std::generic_category(), "cannot create " + path);
  }
}

// A worker's announcement: nullopt when it has none.
std::optional<int> read_generation(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[32];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  char* end = nullptr;
  long value = std::strtol(buf, &end, 10);
  if (end == buf) return std::nullopt;
  return static_cast<int>(value);
}

}  // namespace

InProcessRecovery::InProcessRecovery(std::string dir) : dir_(std::move(dir)) {
  make_dir(dir_);
  make_dir(dir_ + "/ready");
}

bool InProcessRecovery::ready(const std::vector<int>& ranks) const {
  for (int rank : ranks) {
    if (read_generation(dir_ + "/ready/" + std::to_string(rank)) != generation_) return false;
  }
  return true;
}

int InProcessRecovery::begin(const std::vector<int>& failed) {
  announce(generation_ + 1);
  replaced_ = failed;
  return generation_;
}

void InProcessRecovery::follow(int generation) {
  announce(generation);
  replaced_.clear();
}

void InProcessRecovery::announce(int generation) {
  generation_ = generation;
  recovering_ = true;
  began_ = Clock::now();
  const std::string path = dir_ + "/generation";
  const std::string tmp = path + ".tmp";
  const std::string text = std::to_string(generation_) + "\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot write " + tmp);
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::system_error(errno, std::generic_category(), "cannot write " + path);
  }
}

bool InProcessRecovery::complete(const std::vector<int>& ranks) {
  if (!recovering_ || !ready(ranks)) return false;
  recovering_ = false;
  return true;
}

std::chrono::milliseconds InProcessRecovery::elapsed() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began_);
}

}  // namespace ddprun::agent
