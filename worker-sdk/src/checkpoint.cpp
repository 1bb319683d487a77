#include "ddprun/checkpoint.hpp"

#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "group_recovery.hpp"
#include "training_state.hpp"

namespace ddprun {
namespace {

namespace fs = std::filesystem;

constexpr char kMissing = 'M';  // first byte of what rank 0 broadcasts
constexpr char kFound = 'F';
constexpr char kUnreadable = 'U';

[[noreturn]] void fail(const fs::path& path, const std::string& what, int err = 0) {
  throw Error("checkpoint " + path.string() + ": " + what +
              (err ? std::string(": ") + std::strerror(err) : std::string()));
}

// The one owner of a descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Removes the temp file unless the rename consumed it.
struct TempFile {
  fs::path path;
  bool keep = false;
  ~TempFile() {
    std::error_code ec;
    if (!keep) fs::remove(path, ec);
  }
};

void write_all_and_sync(const fs::path& path, const std::string& bytes) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) fail(path, "cannot create", errno);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "cannot write", errno);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) fail(path, "cannot fsync", errno);
}

void sync_directory(const fs::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0) fail(dir, "cannot fsync the directory", errno);
}

// Temp files of saves that crashed (one saver per checkpoint, so none is in use).
void remove_stale_temps(const fs::path& target) {
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(target.parent_path(), ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) fs::remove(entry.path(), ec);
  }
}

// The job's in-memory checkpoint directory and its bound (0: none), from ddprun's environment.
std::optional<std::pair<fs::path, uint64_t>> memory_dir() {
  const char* dir = std::getenv("DDPRUN_MEMORY_CHECKPOINT_DIR");
  std::error_code ec;
  if (!dir || !*dir || !fs::is_directory(dir, ec)) return std::nullopt;
  const char* limit = std::getenv("DDPRUN_MEMORY_CHECKPOINT_LIMIT");
  return std::make_pair(fs::path(dir), limit ? std::strtoull(limit, nullptr, 10) : 0);
}

// Bytes the files in `dir` hold (their memory pages), but for `a` and `b`.
uint64_t used_besides(const fs::path& dir, const fs::path& a, const fs::path& b) {
  uint64_t used = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    struct stat st;
    if (entry.path() != a && entry.path() != b && ::lstat(entry.path().c_str(), &st) == 0 &&
        S_ISREG(st.st_mode)) {
      used += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return used;
}

uint64_t blocks_of(const fs::path& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
}

[[noreturn]] void fail_over_bound(const fs::path& target, uint64_t bytes, uint64_t used,
                                  uint64_t limit) {
  fail(target, "this save (" + std::to_string(bytes >> 20) +
                   " MiB) would pass the job's in-memory bound of " + std::to_string(limit >> 20) +
                   " MiB (" + std::to_string(used >> 20) +
                   " MiB in use); raise ddprun --memory-checkpoints");
}

// The temp file of an in-memory save, locked: the previous save's pages to write over, or a
// new file where there is none or the agent holds it (reading it to send it to another node,
// under a shared flock: replica_io::open_saved).
int open_memory_temp(const fs::path& temp) {
  int fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) fail(temp, "cannot create", errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
  ::close(fd);
  ::unlink(temp.c_str());
  fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) fail(temp, "cannot create", errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    fail(temp, "cannot lock", err);
  }
  return fd;
}

// Writes `parts` one after another from the start of `fd` (no part is empty).
void write_parts(int fd, const std::vector<struct iovec>& parts, const fs::path& path) {
  std::vector<struct iovec> iov(parts);
  size_t i = 0;
  off_t at = 0;
  while (i < iov.size()) {
    const int n = static_cast<int>(std::min<size_t>(iov.size() - i, IOV_MAX));
    ssize_t done = ::pwritev(fd, &iov[i], n, at);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) fail(path, "cannot write", errno);
    if (done == 0) fail(path, "cannot write: the file system took nothing");
    at += done;
    for (; i < iov.size() && static_cast<size_t>(done) >= iov[i].iov_len; ++i) {
      done -= static_cast<ssize_t>(iov[i].iov_len);
    }
    if (done > 0) {  // a short write that ended inside this part
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + done;
      iov[i].iov_len -= static_cast<size_t>(done);
    }
  }
}

// Swaps the two names in one step (renameat2's RENAME_EXCHANGE). False, with nothing changed,
// where `target` does not exist yet or the kernel or file system cannot swap.
bool exchange(const fs::path& temp, const fs::path& target) {
  static std::atomic<bool> unsupported{false};
  if (unsupported) return false;
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    return true;
  }
  if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
    unsupported = true;
  } else if (errno != ENOENT) {
    fail(target, "cannot rename over", errno);
  }
  return false;
}

// A save to the job's in-memory directory, in the raw layout: one pwritev into the pages of
// the save before the previous one, which the rename then swaps with the previous one, so the
// next save writes over it in turn (a tmpfs page costs more to get than the copy into it).
// No fsync: there is no disk under it. Atomic as a file save: `target` is only ever replaced
// by a complete file in one rename; a save killed half-way leaves the temp file, which the
// agent removes before the next attempt.
void save_in_memory(const fs::path& target, const detail::RawTrainingState& raw, uint64_t limit) {
  const fs::path dir = target.parent_path();
  std::string temp_name(1, '.');
  temp_name += target.filename().string();
  temp_name += '.';
  temp_name += std::to_string(::getpid());
  temp_name += ".tmp";
  const fs::path temp = dir / temp_name;
  const uint64_t used = limit ? used_besides(dir, target, temp) : 0;
  if (limit && used + raw.size > limit) fail_over_bound(target, raw.size, used, limit);
  Fd fd(open_memory_temp(temp));
  TempFile guard{temp};
  write_parts(fd.get(), raw.parts, temp);
  if (::ftruncate(fd.get(), static_cast<off_t>(raw.size)) != 0)
    fail(temp, "cannot truncate", errno);
  const uint64_t size = blocks_of(temp);
  if (limit && used + size > limit) fail_over_bound(target, size, used, limit);
  const bool swapped = exchange(temp, target);
  if (!swapped && ::rename(temp.c_str(), target.c_str()) != 0) {
    fail(target, "cannot rename over", errno);
  }
  // Keep the previous save (now the temp file) for the next save to write over, if it fits.
  guard.keep = swapped && !(limit && used + size + blocks_of(temp) > limit);
}

// Rank 0's view of the file, tagged for the broadcast.
std::string read_tagged(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec) && !ec) return std::string(1, kMissing);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in.good() && !in.eof()) return std::string(1, kUnreadable) + std::strerror(errno);
  return kFound + s.str();
}

}  // namespace

void save_checkpoint(const std::string& path, const TrainingProgress& progress,
                     const torch::nn::Module& model, const torch::optim::Optimizer& optimizer) {
  const fs::path target = fs::absolute(path);
  auto memory = memory_dir();
  if (memory && target.parent_path() != fs::absolute(memory->first)) memory.reset();
  if (memory) {
    if (auto raw = detail::raw_training_state(progress, model, optimizer)) {
      save_in_memory(target, *raw, memory->second);
      return;
    }
  }
  const std::string bytes = detail::serialize_training_state(progress, model, optimizer);
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) fail(target.parent_path(), "cannot create the directory: " + ec.message());
  if (memory && memory->second) {  // refused before anything changed
    const uint64_t used = used_besides(memory->first, target, target);
    if (used + bytes.size() > memory->second) {
      fail_over_bound(target, bytes.size(), used, memory->second);
    }
  }
  remove_stale_temps(target);
  TempFile tmp{fs::path(target.string() + ".tmp." + std::to_string(::getpid()))};
  write_all_and_sync(tmp.path, bytes);
  if (::rename(tmp.path.c_str(), target.c_str()) != 0) fail(target, "cannot rename over", errno);
  tmp.keep = true;
  sync_directory(target.parent_path());
}

std::optional<TrainingProgress> load_checkpoint(ProcessGroup& pg, const std::string& path,
                                                torch::nn::Module& model,
                                                torch::optim::Optimizer& optimizer) {
  // A replacement in an in-process recovery gets the state from a survivor (its TrainingLoop),
  // which loaded its checkpoint long ago: no collective, nothing to load.
  if (detail::GroupRecovery::awaiting_state(pg)) return std::nullopt;
  std::string tagged = pg.broadcast_bytes(pg.rank() == 0 ? read_tagged(path) : std::string(), 0);
  if (tagged.empty()) fail(path, "nothing received from rank 0");
  if (tagged[0] == kMissing) return std::nullopt;
  if (tagged[0] == kUnreadable) fail(path, "cannot read on rank 0: " + tagged.substr(1));
  try {
    return detail::restore_training_state(tagged.data() + 1, tagged.size() - 1, pg.device(), model,
                                          optimizer);
  } catch (const Error& e) {
    fail(path, std::string("not a checkpoint of this model: ") + e.what());
  } catch (const c10::Error& e) {
    fail(path, std::string("truncated, corrupt or not a checkpoint of this model (") +
                   e.what_without_backtrace() + ")");
  } catch (const std::exception& e) {
    fail(path,
         std::string("truncated, corrupt or not a checkpoint of this model (") + e.what() + ")");
  }
}

std::optional<std::string> memory_checkpoint_path(const std::string& name) {
  if (name.empty() || name[0] == '.' || name.find('/') != std::string::npos) {
    throw Error("memory checkpoint name '" + name + "': a plain file name, not starting with '.'");
  }
  auto memory = memory_dir();
  if (!memory) return std::nullopt;
  return (memory->first / name).string();
}

}  // namespace ddprun
