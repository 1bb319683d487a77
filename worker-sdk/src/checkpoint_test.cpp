#include "ddprun/checkpoint.hpp"

#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <type_traits>

#include "test_ranks.hpp"

namespace ddprun {
namespace {

namespace fs = std::filesystem;
using testing::errors_of_ranks;
using testing::run_ranks;

// A parameter's optimizer state. LibTorch 1.x keys it by its TensorImpl's address as text,
// 2.x by the address itself.
template <typename StateMap>
torch::optim::OptimizerParamState& param_state(StateMap& state, const torch::Tensor& p) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    return *state.at(c10::str(p.unsafeGetTensorImpl()));
  } else {
    return *state.at(p.unsafeGetTensorImpl());
  }
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ddprun_ckpt_XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

// One step of Adam on a small model, from a seed, so two models start apart.
struct Trained {
  torch::nn::Linear model;
  torch::optim::Adam optimizer;
  explicit Trained(int seed)
      : model((torch::manual_seed(seed), torch::nn::Linear(4, 3))),
        optimizer(model->parameters(), torch::optim::AdamOptions(0.1)) {
    optimizer.zero_grad();
    model(torch::randn({8, 4})).pow(2).sum().backward();
    optimizer.step();
  }
};

TEST(Checkpoint, RoundTripOnEveryRank) {
  TempDir dir;
  const std::string path = (dir.path / "sub" / "ckpt.pt").string();
  Trained saved(1);
  TrainingProgress progress{3, 42, {{"seed", 7}}};
  save_checkpoint(path, progress, *saved.model, saved.optimizer);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path / "sub"), {}), 1);  // no temp left
  run_ranks(2, [&](int rank, ProcessGroup& pg) {
    Trained fresh(100 + rank);
    auto got = load_checkpoint(pg, path, *fresh.model, fresh.optimizer);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->epoch, 3);
    EXPECT_EQ(got->step, 42);
    EXPECT_EQ(got->extra, progress.extra);
    EXPECT_TRUE(torch::equal(fresh.model->weight, saved.model->weight));
    EXPECT_TRUE(torch::equal(fresh.model->bias, saved.model->bias));
    auto& mine = static_cast<torch::optim::AdamParamState&>(
        param_state(fresh.optimizer.state(), fresh.model->weight));
    auto& theirs = static_cast<torch::optim::AdamParamState&>(
        param_state(saved.optimizer.state(), saved.model->weight));
    EXPECT_TRUE(torch::equal(mine.exp_avg(), theirs.exp_avg()));
    EXPECT_TRUE(torch::equal(mine.exp_avg_sq(), theirs.exp_avg_sq()));
  });
}

// Python's load_state_dict semantics: the values change, the tensors do not (so the gradient
// hooks of a DistributedDataParallel wrapping the model keep firing).
TEST(Checkpoint, RestoresIntoTheModelsOwnTensors) {
  TempDir dir;
  const std::string path = (dir.path / "ckpt.pt").string();
  Trained saved(1);
  save_checkpoint(path, {}, *saved.model, saved.optimizer);
  run_ranks(2, [&](int rank, ProcessGroup& pg) {
    Trained fresh(100 + rank);
    const void* storage = fresh.model->weight.data_ptr();
    auto accumulator = torch::autograd::impl::grad_accumulator(fresh.model->weight);
    ASSERT_TRUE(load_checkpoint(pg, path, *fresh.model, fresh.optimizer).has_value());
    EXPECT_TRUE(torch::equal(fresh.model->weight, saved.model->weight));
    EXPECT_EQ(fresh.model->weight.data_ptr(), storage);
    EXPECT_EQ(torch::autograd::impl::try_get_grad_accumulator(fresh.model->weight).get(),
              accumulator.get());
  });
}

TEST(Checkpoint, ModelOfAnotherShapeIsAnErrorNamingTheParameter) {
  TempDir dir;
  const fs::path path = dir.path / "ckpt.pt";
  Trained saved(1);
  save_checkpoint(path.string(), {}, *saved.model, saved.optimizer);
  auto errors = errors_of_ranks(2, [&](int, ProcessGroup& pg) {
    torch::nn::Linear other(5, 3);
    torch::optim::Adam optimizer(other->parameters(), torch::optim::AdamOptions(0.1));
    load_checkpoint(pg, path.string(), *other, optimizer);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("checkpoint " + path.string() +
                     ": not a checkpoint of this model: "
                     "parameter weight is Float [3, 5] in the model but Float [3, 4] in the "
                     "checkpoint"),
              std::string::npos)
        << e;
  }
}

TEST(Checkpoint, MissingFileMeansStartFresh) {
  TempDir dir;
  run_ranks(2, [&](int, ProcessGroup& pg) {
    Trained t(1);
    auto before = t.model->weight.clone();
    EXPECT_FALSE(load_checkpoint(pg, (dir.path / "none.pt").string(), *t.model, t.optimizer));
    EXPECT_TRUE(torch::equal(before, t.model->weight));
  });
}

TEST(Checkpoint, TruncatedFileIsAnErrorNamingItOnEveryRank) {
  TempDir dir;
  const fs::path path = dir.path / "ckpt.pt";
  Trained saved(1);
  save_checkpoint(path.string(), {}, *saved.model, saved.optimizer);
  fs::resize_file(path, fs::file_size(path) / 2);
  auto errors = errors_of_ranks(2, [&](int, ProcessGroup& pg) {
    Trained t(2);
    load_checkpoint(pg, path.string(), *t.model, t.optimizer);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("checkpoint " + path.string() + ": truncated, corrupt"), std::string::npos)
        << e;
  }
}

TEST(Checkpoint, SaveRemovesTempFilesOfCrashedSaves) {
  TempDir dir;
  const fs::path path = dir.path / "ckpt.pt";
  std::ofstream(path.string() + ".tmp.99999") << "half a checkpoint";
  Trained saved(1);
  save_checkpoint(path.string(), {}, *saved.model, saved.optimizer);
  EXPECT_FALSE(fs::exists(path.string() + ".tmp.99999"));
  EXPECT_TRUE(fs::exists(path));
}

// The in-memory target as ddprun hands it to the workers (DDPRUN_MEMORY_CHECKPOINT_DIR and its
// bound): a path in it, a save that fits, one that would pass the bound refused with the
// previous save kept, and names that would leave the directory refused.
TEST(Checkpoint, MemoryTargetKeepsTheJobsBound) {
  TempDir dir;
  ::unsetenv("DDPRUN_MEMORY_CHECKPOINT_DIR");
  EXPECT_EQ(memory_checkpoint_path(), std::nullopt);  // not under ddprun
  ::setenv("DDPRUN_MEMORY_CHECKPOINT_DIR", dir.path.c_str(), 1);
  ::setenv("DDPRUN_MEMORY_CHECKPOINT_LIMIT", "200000", 1);
  const auto path = memory_checkpoint_path();
  ASSERT_TRUE(path);
  EXPECT_EQ(*path, (dir.path / "checkpoint.pt").string());
  Trained small(1);
  save_checkpoint(*path, {0, 5, {}}, *small.model, small.optimizer);
  const auto size = fs::file_size(*path);

  torch::manual_seed(2);
  torch::nn::Linear big(200, 200);  // 160 KB of weights, plus Adam's two moments
  torch::optim::Adam adam(big->parameters());
  adam.zero_grad();
  big(torch::randn({2, 200})).sum().backward();
  adam.step();
  try {
    save_checkpoint(*path, {0, 6, {}}, *big, adam);
    ADD_FAILURE() << "a save past the bound was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("raise ddprun --memory-checkpoints"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fs::file_size(*path), size);  // the previous save is intact
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), {}), 1);
  EXPECT_THROW(memory_checkpoint_path("../escape.pt"), Error);
  EXPECT_THROW(memory_checkpoint_path(".hidden"), Error);
  ::unsetenv("DDPRUN_MEMORY_CHECKPOINT_DIR");
  ::unsetenv("DDPRUN_MEMORY_CHECKPOINT_LIMIT");
}

// Points DDPRUN_MEMORY_CHECKPOINT_DIR (and its bound) at a temp directory while it lives.
struct MemoryDir : TempDir {
  explicit MemoryDir(uint64_t limit = 0) {
    ::setenv("DDPRUN_MEMORY_CHECKPOINT_DIR", path.c_str(), 1);
    ::setenv("DDPRUN_MEMORY_CHECKPOINT_LIMIT", std::to_string(limit).c_str(), 1);
  }
  ~MemoryDir() {
    ::unsetenv("DDPRUN_MEMORY_CHECKPOINT_DIR");
    ::unsetenv("DDPRUN_MEMORY_CHECKPOINT_LIMIT");
  }
  std::string target() const { return *memory_checkpoint_path(); }
};

std::string file_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

ino_t inode(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

// A model with buffers (BatchNorm's running statistics) and two optimizer steps behind it.
struct Net {
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  Net(int seed,
      const std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>&
          make)
      : model((torch::manual_seed(seed),
               torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6),
                                     torch::nn::Linear(6, 2)))),
        optimizer(make(model->parameters())) {}
  // One step on a fixed batch (the same on every Net, from no random generator: the ranks of
  // run_ranks are threads).
  void step() {
    const auto x = torch::arange(32, torch::kFloat).reshape({8, 4}).sin();
    auto loss = [&] {
      optimizer->zero_grad();
      auto l = model->forward(x).pow(2).sum();
      l.backward();
      return l;
    };
    optimizer->step(loss);
  }
};

// An optimizer of the user's: saved in its own archive format.
struct OwnSgd : torch::optim::SGD {
  using SGD::SGD;
};

// The in-memory target holds each optimizer LibTorch ships (but LBFGS) in the raw layout (and
// any other, a user's here, in LibTorch's archive inside it): restored into a model and
// optimizer built with other values and another learning rate, the next step gives the same
// parameters as the saver's next step, so the parameters, buffers, moments, step counters and
// options all came back.
TEST(Checkpoint, MemorySaveRestoresEveryOptimizerKind) {
  using torch::optim::OptimizerParamGroup;
  using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;
  const std::vector<std::pair<std::string, Make>> kinds{
      {"sgd",
       [](auto p) {
         return std::make_unique<torch::optim::SGD>(
             p, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
       }},
      {"adam",
       [](auto p) {
         return std::make_unique<torch::optim::Adam>(p,
                                                     torch::optim::AdamOptions(0.01).amsgrad(true));
       }},
      {"adamw",
       [](auto p) {
         return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.01));
       }},
      {"adagrad",
       [](auto p) {
         return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(0.1));
       }},
      {"rmsprop",
       [](auto p) {
         return std::make_unique<torch::optim::RMSprop>(
             p, torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
       }},
      {"own",
       [](auto p) {
         return std::make_unique<OwnSgd>(p, torch::optim::SGDOptions(0.1).momentum(0.5));
       }},
  };
  for (const auto& [kind, make] : kinds) {
    SCOPED_TRACE(kind);
    MemoryDir memory;
    Net saved(1, make);
    saved.step();
    saved.step();
    // A scheduler's change, restored as Python's load_state_dict does (LibTorch's own load,
    // which the archive uses, keeps the optimizer's options).
    const double lr = kind == "own" ? 0.1 : 0.02;
    saved.optimizer->param_groups()[0].options().set_lr(lr);
    save_checkpoint(memory.target(), {2, 9, {{"seed", 5}}}, *saved.model, *saved.optimizer);
    EXPECT_EQ(file_text(memory.target()).rfind("DDPRUN-STATE1\n", 0), 0u);
    saved.step();  // what the restored ones must do next
    run_ranks(2, [&](int rank, ProcessGroup& pg) {
      Net fresh(100 + rank, make);
      fresh.step();
      const void* storage = fresh.model->parameters()[0].data_ptr();
      auto got = load_checkpoint(pg, memory.target(), *fresh.model, *fresh.optimizer);
      ASSERT_TRUE(got.has_value());
      EXPECT_EQ(got->epoch, 2);
      EXPECT_EQ(got->step, 9);
      EXPECT_EQ(got->extra, (std::map<std::string, int64_t>{{"seed", 5}}));
      EXPECT_EQ(fresh.model->parameters()[0].data_ptr(), storage);  // restored in place
      EXPECT_DOUBLE_EQ(fresh.optimizer->param_groups()[0].options().get_lr(), lr) << kind;
      fresh.step();
      for (const auto& p : saved.model->named_parameters()) {
        EXPECT_TRUE(torch::equal(fresh.model->named_parameters()[p.key()], p.value())) << p.key();
      }
      for (const auto& b : saved.model->named_buffers()) {
        EXPECT_TRUE(torch::equal(fresh.model->named_buffers()[b.key()], b.value())) << b.key();
      }
    });
  }
}

// A save every step writes into the pages of the save before the previous one (the file the
// rename swapped out), except while the agent reads that file to send it to another node
// (under a shared flock): then the save takes a new file and the one being read stays as it
// was. Where the bound has no room for the spare, it is removed.
TEST(Checkpoint, MemorySavesWriteOverTheSaveBeforeTheLast) {
  MemoryDir memory;
  Trained t(1);
  const fs::path target = memory.target();
  const fs::path spare = memory.path / (".checkpoint.pt." + std::to_string(::getpid()) + ".tmp");
  save_checkpoint(target, {0, 1, {}}, *t.model, t.optimizer);
  const ino_t first = inode(target);
  save_checkpoint(target, {0, 2, {}}, *t.model, t.optimizer);
  const ino_t second = inode(target);
  EXPECT_NE(second, first);
  EXPECT_EQ(inode(spare), first);  // the first save, kept to be written over
  save_checkpoint(target, {0, 3, {}}, *t.model, t.optimizer);
  EXPECT_EQ(inode(target), first);
  EXPECT_EQ(inode(spare), second);
  EXPECT_EQ(std::distance(fs::directory_iterator(memory.path), {}), 2);

  // The agent reads the third save (in the first file) while two more are made.
  const std::string third = file_text(target);
  const int reader = ::open(target.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  ASSERT_EQ(::flock(reader, LOCK_SH), 0);
  save_checkpoint(target, {0, 4, {}}, *t.model, t.optimizer);  // into the second file
  EXPECT_EQ(inode(target), second);
  save_checkpoint(target, {0, 5, {}}, *t.model, t.optimizer);  // the first is held: a new one
  EXPECT_NE(inode(target), first);
  EXPECT_NE(inode(target), second);
  std::string held(third.size() + 1, '\0');
  EXPECT_EQ(::pread(reader, held.data(), held.size(), 0), static_cast<ssize_t>(third.size()));
  held.resize(third.size());
  EXPECT_EQ(held, third);
  ::close(reader);
  run_ranks(1, [&](int, ProcessGroup& pg) {
    Trained fresh(2);
    EXPECT_EQ(load_checkpoint(pg, target.string(), *fresh.model, fresh.optimizer)->step, 5);
  });

  // A bound with room for one save and not two (in memory pages): no spare is kept.
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  ::setenv("DDPRUN_MEMORY_CHECKPOINT_LIMIT", std::to_string(st.st_blocks * 512 * 3 / 2).c_str(), 1);
  fs::remove(spare);
  save_checkpoint(target, {0, 6, {}}, *t.model, t.optimizer);
  save_checkpoint(target, {0, 7, {}}, *t.model, t.optimizer);
  EXPECT_FALSE(fs::exists(spare));
  EXPECT_EQ(std::distance(fs::directory_iterator(memory.path), {}), 1);
}

// A raw save cut short or with a foreign header is refused on every rank, naming the file.
TEST(Checkpoint, TornOrForeignMemorySaveIsAnError) {
  MemoryDir memory;
  Trained saved(1);
  const fs::path target = memory.target();
  save_checkpoint(target, {}, *saved.model, saved.optimizer);
  const std::string whole = file_text(target);
  for (const std::string& bytes :
       {whole.substr(0, whole.size() - 1), whole.substr(0, 40),
        whole.substr(0, 14) + std::string(8, '\xff') + whole.substr(22)}) {
    std::ofstream(target, std::ios::binary | std::ios::trunc) << bytes;
    auto errors = errors_of_ranks(2, [&](int, ProcessGroup& pg) {
      Trained t(2);
      load_checkpoint(pg, target.string(), *t.model, t.optimizer);
    });
    ASSERT_EQ(errors.size(), 2u);
    for (const auto& e : errors) {
      EXPECT_NE(e.find("checkpoint " + target.string() + ": truncated, corrupt"), std::string::npos)
          << e;
    }
  }
}
}  // namespace
}  // namespace ddprun
