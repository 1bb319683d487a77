#include "examples/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFile = "checkpoint.pt";

// One owner for the temp file's descriptor; fsync before the rename makes the new file durable.
void write_durably(const fs::path& path, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "open " + path.string());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::system_error(errno, std::generic_category(), "write " + path.string());
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) throw std::system_error(errno, std::generic_category(), "fsync");
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                            torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  archive.write("step", torch::tensor(meta.step));
  archive.write("global_batch", torch::tensor(meta.global_batch));
  archive.write("seed", torch::tensor(meta.seed));
  torch::serialize::OutputArchive model_archive, optimizer_archive;
  model.save(model_archive);
  optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  std::ostringstream out;
  archive.save_to(out);

  fs::create_directories(dir);
  const fs::path target = fs::path(dir) / kFile;
  fs::path tmp = target;
  tmp += ".tmp." + std::to_string(::getpid());
  write_durably(tmp, out.str());
  fs::rename(tmp, target);  // atomic on POSIX: readers see the old or the new checkpoint
  return target.string();
}

std::optional<CheckpointMeta> load_checkpoint(ddprun::ProcessGroup& pg, const std::string& dir,
                                              torch::nn::Module& model,
                                              torch::optim::Optimizer& optimizer) {
  std::string bytes;
  if (pg.rank() == 0) {
    std::ifstream in(fs::path(dir) / kFile, std::ios::binary);
    if (in) {
      std::ostringstream s;
      s << in.rdbuf();
      bytes = s.str();
    }
  }
  bytes = pg.broadcast_bytes(bytes, 0);
  if (bytes.empty()) return std::nullopt;

  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  CheckpointMeta meta;
  torch::Tensor t;
  archive.read("step", t);
  meta.step = t.item<int64_t>();
  archive.read("global_batch", t);
  meta.global_batch = t.item<int64_t>();
  archive.read("seed", t);
  meta.seed = t.item<int64_t>();
  torch::serialize::InputArchive model_archive, optimizer_archive;
  archive.read("model", model_archive);
  archive.read("optimizer", optimizer_archive);
  model.load(model_archive);
  optimizer.load(optimizer_archive);
  return meta;
}

}  // namespace train
