#include "ddprun/checkpoint.hpp"

#include <fcntl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <cerrno>
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

// A save into the memory directory that would pass its bound: refused before anything changed.
void check_memory_bound(const fs::path& target, size_t bytes) {
  auto memory = memory_dir();
  if (!memory || memory->second == 0 || target.parent_path() != fs::absolute(memory->first)) {
    return;
  }
  uint64_t used = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(memory->first, ec)) {
    if (entry.path() != target && entry.is_regular_file(ec)) used += entry.file_size(ec);
  }
  if (used + bytes > memory->second) {
    fail(target, "this save (" + std::to_string(bytes >> 20) +
                     " MiB) would pass the job's "
                     "in-memory bound of " +
                     std::to_string(memory->second >> 20) + " MiB (" + std::to_string(used >> 20) +
                     " MiB in use); raise ddprun --memory-checkpoints");
  }
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

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key) {
  torch::Tensor t;
  archive.read(key, t);
  return t.item<int64_t>();
}

std::string shape_text(const at::Tensor& t) {
  std::ostringstream s;
  s << t.scalar_type() << " " << t.sizes();
  return s.str();
}

// One saved tensor copied into `target` (a parameter or buffer of the model).
void copy_saved(torch::serialize::InputArchive& archive, const std::string& name,
                const std::string& key, at::Tensor& target, bool is_buffer) {
  at::Tensor saved;  // undefined: the archive hands over its tensor instead of set_()ting ours
  archive.read(key, saved, is_buffer);
  if (!target.defined()) {  // an optional buffer (e.g. BatchNorm without running stats)
    target = saved;
    return;
  }
  if (saved.sizes() != target.sizes() || saved.scalar_type() != target.scalar_type()) {
    throw Error(std::string(is_buffer ? "buffer " : "parameter ") + name + " is " +
                shape_text(target) + " in the model but " + shape_text(saved) +
                " in the checkpoint");
  }
  target.copy_(saved);
}

// The model's state restored in place, as Python's load_state_dict does: every parameter and
// buffer keeps its tensor (storage, gradient accumulator, DDP's hooks, the views ZeRO and DDP
// made of it), only its values change. Module::load would set_() each one to the archive's
// tensor instead, which detaches the parameters from a DistributedDataParallel that wraps them.
// Same archive layout as Module::save: own parameters, own buffers, one sub-archive per child.
void restore_module(torch::nn::Module& module, torch::serialize::InputArchive& archive,
                    const std::string& prefix) {
  at::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(/*recurse=*/false)) {
    copy_saved(archive, prefix + item.key(), item.key(), item.value(), false);
  }
  for (auto& item : module.named_buffers(/*recurse=*/false)) {
    copy_saved(archive, prefix + item.key(), item.key(), item.value(), true);
  }
  for (const auto& child : module.named_children()) {
    torch::serialize::InputArchive child_archive;
    archive.read(child.key(), child_archive);
    restore_module(*child.value(), child_archive, prefix + child.key() + ".");
  }
}

}  // namespace

namespace detail {

std::string serialize_training_state(const TrainingProgress& progress,
                                     const torch::nn::Module& model,
                                     const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive, model_archive, optimizer_archive, extra;
  archive.write("epoch", torch::tensor(progress.epoch));
  archive.write("step", torch::tensor(progress.step));
  for (const auto& [name, value] : progress.extra) extra.write(name, torch::tensor(value));
  archive.write("extra", extra);
  model.save(model_archive);
  optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

TrainingProgress restore_training_state(const char* bytes, size_t size, c10::Device device,
                                        torch::nn::Module& model,
                                        torch::optim::Optimizer& optimizer) {
  torch::serialize::InputArchive archive, model_archive, optimizer_archive, extra;
  archive.load_from(bytes, size, device);
  TrainingProgress progress;
  progress.epoch = read_int(archive, "epoch");
  progress.step = read_int(archive, "step");
  archive.read("extra", extra);
  for (const auto& key : extra.keys()) progress.extra[key] = read_int(extra, key);
  archive.read("model", model_archive);
  archive.read("optimizer", optimizer_archive);
  restore_module(model, model_archive, "");
  optimizer.load(optimizer_archive);
  return progress;
}

}  // namespace detail

void save_checkpoint(const std::string& path, const TrainingProgress& progress,
                     const torch::nn::Module& model, const torch::optim::Optimizer& optimizer) {
  const fs::path target = fs::absolute(path);
  const std::string bytes = detail::serialize_training_state(progress, model, optimizer);
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) fail(target.parent_path(), "cannot create the directory: " + ec.message());
  check_memory_bound(target, bytes.size());
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
