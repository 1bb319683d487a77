// Saves to the in-memory directory at its edges: a tmpfs that runs out of room, a process that
// forks between saves.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "ddprun/checkpoint.hpp"
#include "test_ranks.hpp"

namespace ddprun {
namespace {

namespace fs = std::filesystem;

// A model and optimizer whose save is about 320 KB (weights and momentum).
struct Big {
  torch::nn::Linear model{torch::nn::Linear(200, 200)};
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
  Big() {
    model(torch::randn({4, 200})).sum().backward();
    optimizer.step();
  }
};

std::string file_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs `body` in a child process; its exit status (a signal is a crash). The child runs no
// LibTorch operator (its OpenMP pool does not survive a fork): a save is a copy.
int in_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

int64_t saved_step(const std::string& target) {
  int64_t step = -1;
  testing::run_ranks(1, [&](int, ProcessGroup& pg) {
    Big fresh;
    step = load_checkpoint(pg, target, *fresh.model, fresh.optimizer).value().step;
  });
  return step;
}

constexpr int kSkip = 77;

// Saves are copied into mapped pages: a tmpfs without room for the next file must fail the
// save with an error (the pages are got before the copy), not kill the process with SIGBUS,
// and leave the previous save in place.
TEST(MemorySave, FullTmpfsIsAnErrorNotACrash) {
  Big big;  // made here: LibTorch's thread pool cannot run in a forked child
  const int status = in_child([&] {
    std::string dir = (fs::temp_directory_path() / "memsave_XXXXXX").string();
    if (!::mkdtemp(dir.data()) || ::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=400k,mode=0700") != 0) {
      return kSkip;  // not root, or no mount namespaces here
    }
    ::setenv("DDPRUN_MEMORY_CHECKPOINT_DIR", dir.c_str(), 1);
    const std::string target = *memory_checkpoint_path();
    save_checkpoint(target, {0, 1, {}}, *big.model, big.optimizer);
    const std::string first = file_text(target);
    try {
      save_checkpoint(target, {0, 2, {}}, *big.model, big.optimizer);  // a second file: no room
      return 1;
    } catch (const Error& e) {
      if (std::string(e.what()).find("cannot get the memory for this save") == std::string::npos) {
        return 2;
      }
    }
    if (file_text(target) != first) return 3;
    if (std::distance(fs::directory_iterator(dir), {}) != 1) return 4;  // the temp file is gone
    return 0;
  });
  if (WIFEXITED(status) && WEXITSTATUS(status) == kSkip) GTEST_SKIP() << "needs root";
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A child forked between saves writes its own files: never into the pages of the parent's
// spare, which the parent goes on writing.
TEST(MemorySave, AForkedChildSavesIntoItsOwnFiles) {
  std::string dir = (fs::temp_directory_path() / "memsave_XXXXXX").string();
  ASSERT_TRUE(::mkdtemp(dir.data()));
  ::setenv("DDPRUN_MEMORY_CHECKPOINT_DIR", dir.c_str(), 1);
  const std::string target = *memory_checkpoint_path();
  const fs::path spare = fs::path(dir) / (".checkpoint.pt." + std::to_string(::getpid()) + ".tmp");
  Big big;
  save_checkpoint(target, {0, 1, {}}, *big.model, big.optimizer);
  save_checkpoint(target, {0, 2, {}}, *big.model, big.optimizer);
  const std::string kept = file_text(spare);  // the first save, kept to be written over
  const int status = in_child([&] {
    save_checkpoint(target, {0, 3, {}}, *big.model, big.optimizer);
    save_checkpoint(target, {0, 4, {}}, *big.model, big.optimizer);
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(file_text(spare), kept);
  EXPECT_EQ(saved_step(target), 4);
  save_checkpoint(target, {0, 5, {}}, *big.model, big.optimizer);
  EXPECT_EQ(saved_step(target), 5);
  ::unsetenv("DDPRUN_MEMORY_CHECKPOINT_DIR");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ddprun
