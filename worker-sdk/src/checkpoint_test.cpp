#include "ddprun/checkpoint.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
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

}  // namespace
}  // namespace ddprun
