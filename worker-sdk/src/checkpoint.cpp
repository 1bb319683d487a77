#include "ddprun/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "group_recovery.hpp"
#include "memory_save.hpp"
#include "training_state.hpp"

namespace ddprun {
namespace {

namespace fs = std::filesystem;

constexpr char kMissing = 'M';  // first byte of what rank 0 broadcasts
constexpr char kFound = 'F';
constexpr char kUnreadable = 'U';

using detail::fail;

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
      detail::save_in_memory(target, *raw, memory->second);
      return;
    }
  }
  const std::string bytes = detail::serialize_training_state(progress, model, optimizer);
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) fail(target.parent_path(), "cannot create the directory: " + ec.message());
  if (memory && memory->second) {  // refused before anything changed
    const uint64_t used = detail::memory_used_besides(memory->first, target, target);
    if (used + bytes.size() > memory->second) {
      detail::fail_over_bound(target, bytes.size(), used, memory->second);
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
