#include "agent/memory_checkpoints.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "agent/process/guardian.hpp"
#include "store/sys/random.hpp"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;

constexpr long kTmpfsMagic = 0x01021994;
constexpr const char* kPrefix = "ddprun-";

// The directory at `path`, opened and flock()ed (exclusive, without waiting); invalid when
// another process holds it (or it is gone).
sys::UniqueFd lock_directory(const std::string& path) {
  sys::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.get() >= 0 && ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) fd.reset();
  return fd;
}

// The in-memory directories of this user's jobs whose agents are all gone (killed with their
// guardian): nobody holds their lock.
void remove_abandoned(const std::string& base) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(base, ec)) {
    const std::string name = entry.path().filename().string();
    struct stat st {};
    if (!name.starts_with(kPrefix) || ::lstat(entry.path().c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
      continue;
    }
    if (sys::UniqueFd held = lock_directory(entry.path().string()); held.get() >= 0) {
      fs::remove_all(entry.path(), ec);
    }
  }
}

}  // namespace

MemoryCheckpoints::MemoryCheckpoints(const std::string& run_id, uint64_t limit_bytes,
                                     Guardian* guardian, const std::string& base)
    : guardian_(guardian) {
  struct statfs fsinfo {};
  if (::statfs(base.c_str(), &fsinfo) != 0) {
    throw std::runtime_error(base + ": " + std::strerror(errno));
  }
  if (fsinfo.f_type != kTmpfsMagic) throw std::runtime_error(base + " is not a tmpfs");
  const uint64_t free = static_cast<uint64_t>(fsinfo.f_bavail) * fsinfo.f_bsize;
  limit_ = std::min(limit_bytes, free);
  // The run id comes from the command line: only its safe characters go into the name.
  std::string id;
  for (char c : run_id.substr(0, 64)) {
    id += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  }
  remove_abandoned(base);
  // Made under a name the sweep above skips, locked, then named: another agent's sweep never
  // sees it unlocked.
  const std::string suffix = id + "-" + sys::random_hex(4);
  const std::string making = base + "/." + kPrefix + suffix;
  path_ = base + "/" + kPrefix + suffix;
  if (::mkdir(making.c_str(), 0700) != 0) {
    throw std::runtime_error("mkdir " + making + ": " + std::strerror(errno));
  }
  lock_ = lock_directory(making);
  if (lock_.get() < 0 || ::rename(making.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::error_code ignored;
    fs::remove_all(making, ignored);
    throw std::runtime_error("cannot lock and name " + path_ + ": " + std::strerror(err));
  }
  if (guardian_) guardian_->remove_at_exit(path_);
}

MemoryCheckpoints::~MemoryCheckpoints() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
  if (guardian_) guardian_->remove_at_exit("");
}

uint64_t bytes_under(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& entry : fs::recursive_directory_iterator(dir, ec)) {
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      total += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return total;
}

uint64_t MemoryCheckpoints::used_bytes() const { return bytes_under(path_); }

void MemoryCheckpoints::remove_partial_saves() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(path_, ec)) {
    const std::string name = entry.path().filename().string();
    // ".<name>.<pid>.tmp" (the Python module), "<name>.tmp.<pid>" (the C++ SDK)
    const size_t sdk = name.rfind(".tmp.");
    const bool sdk_temp = sdk != std::string::npos && sdk + 5 < name.size() &&
                          name.find_first_not_of("0123456789", sdk + 5) == std::string::npos;
    if ((name.starts_with(".") && name.ends_with(".tmp")) || sdk_temp) fs::remove(entry.path(), ec);
  }
}

}  // namespace ddprun::agent
