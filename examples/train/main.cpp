// train: a real data-parallel training job on ddprun's C++ worker SDK.
//
//   ddprun --standalone --nproc_per_node=2 build/bin/train --steps 200 --global-batch 64
//       --seed 3 --checkpoint /tmp/ckpt
//
// Every rank builds the same seeded dataset and model; DistributedSampler splits the data;
// DistributedDataParallel averages gradients; rank 0 logs the loss and writes checkpoints, and a
// restarted job (ddprun --max_restarts) resumes from the last one with the same data order. The
// final line, `final params checksum: <sum of all parameters>`, does not depend on the world size.
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <optional>

#include "ddprun/ddp.hpp"
#include "examples/train/data.hpp"
#include "examples/train/model.hpp"
#include "examples/train/options.hpp"

namespace train {
namespace {

ddprun::GradCompression compression_of(const std::string& name) {
  if (name == "fp16") return ddprun::GradCompression::kFp16;
  if (name == "bf16") return ddprun::GradCompression::kBf16;
  return ddprun::GradCompression::kNone;
}

double wall_seconds() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count() / 1e6;
}

// --timeline FILE: one JSON line per phase, {"attempt", "rank", "pid", "phase", "t"[, "step"]},
// as tests/bench/recovery_worker.py writes them. The file is opened with O_APPEND and every line
// is a single write(), so the ranks' lines never interleave. Without --timeline, does nothing.
class Timeline {
 public:
  explicit Timeline(const std::string& path) {
    if (path.empty()) return;
    fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw ddprun::Error("--timeline " + path + ": cannot open");
  }
  ~Timeline() {
    if (fd_ >= 0) ::close(fd_);
  }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Call after init_process_group(): a standby worker (ddprun --in-process-recovery) learns its
  // rank there.
  void mark(const char* phase, int64_t step = -1, double t = wall_seconds()) const {
    if (fd_ < 0) return;
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    const char* rank = std::getenv("RANK");
    const int attempt_ = attempt ? std::atoi(attempt) : 0;
    const int rank_ = rank ? std::atoi(rank) : 0;
    char line[256];
    int n = std::snprintf(line, sizeof line,
                          "{\"attempt\": %d, \"rank\": %d, \"pid\": %d, \"phase\": \"%s\", "
                          "\"t\": %.6f",
                          attempt_, rank_, static_cast<int>(::getpid()), phase, t);
    if (step >= 0)
      n += std::snprintf(line + n, sizeof line - n, ", \"step\": %lld",
                         static_cast<long long>(step));
    n += std::snprintf(line + n, sizeof line - n, "}\n");
    if (::write(fd_, line, n) != n) std::perror("train: --timeline write");
  }

 private:
  int fd_ = -1;
};

double checksum(torch::nn::Module& model) {
  double sum = 0;
  for (const auto& p : model.parameters())
    sum += p.detach().to(torch::kDouble).sum().item<double>();
  return sum;
}

// The device to train on: the process group's, or with --device cuda the local rank's GPU.
torch::Device pick_device(const Options& opt, ddprun::ProcessGroup& pg) {
  if (opt.device != "cuda" || pg.device().is_cuda()) return pg.device();
  const int local = pg.env().local_rank;
  if (!torch::cuda::is_available() || local >= static_cast<int>(torch::cuda::device_count())) {
    throw ddprun::Error("--device cuda: no CUDA device for LOCAL_RANK " + std::to_string(local));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local));
}

struct Resumed {
  int64_t step = 0;
  std::string from;  // the source it came from; empty: nothing to resume, step 0
};

// The first of `sources` (empty ones skipped) that holds a checkpoint, loaded into the model and
// optimizer; refused when it was written with other run settings (another data order).
Resumed resume(ddprun::ProcessGroup& pg, const std::vector<std::string>& sources,
               const std::map<std::string, int64_t>& run_settings, torch::nn::Module& model,
               torch::optim::Optimizer& optimizer) {
  for (const std::string& source : sources) {
    if (source.empty()) continue;
    std::optional<ddprun::TrainingProgress> saved =
        ddprun::load_checkpoint(pg, source, model, optimizer);
    if (!saved) continue;
    if (saved->extra != run_settings) {
      throw ddprun::Error("checkpoint " + source + " was written with --global-batch " +
                          std::to_string(saved->extra["global_batch"]) + " --seed " +
                          std::to_string(saved->extra["seed"]) +
                          "; this run would change the data order");
    }
    return Resumed{saved->step, source};
  }
  return Resumed{};
}

// Rank 0's first line: the job's shape and where it starts.
void announce(const Options& opt, ddprun::ProcessGroup& pg,
              ddprun::DistributedDataParallel<Mlp>& ddp, const torch::Device& device,
              int64_t local_batch, const Resumed& resumed, const std::string& checkpoint_file) {
  std::cout << "[train] world " << pg.size() << ", backend " << pg.backend_name()
            << " (gradients: " << ddp.transport() << "), device " << device << ", "
            << opt.dataset_size << " samples, global batch " << opt.global_batch << " ("
            << local_batch << " per rank), "
            << (resumed.from.empty()
                    ? std::string("starting at step 0")
                    : "resuming at step " + std::to_string(resumed.step) + " from " +
                          (resumed.from == checkpoint_file ? "the checkpoint file" : "memory"))
            << ", restart " << pg.env().restart_count << std::endl;
}

// What the training loop runs for each step (one) and after it (after): the batch, the
// --kill-rank-at-step fault, the loss line, the in-memory and file checkpoints.
struct Steps {
  const Options& opt;
  const Timeline& timeline;
  ddprun::ProcessGroup& pg;
  const Dataset& data;
  BatchStream& stream;
  torch::Device device;
  ddprun::DistributedDataParallel<Mlp>& ddp;
  Mlp model;
  torch::optim::SGD& optimizer;
  std::optional<std::string> memory;
  std::string checkpoint_file;
  std::map<std::string, int64_t> run_settings;
  at::Tensor loss;
  int marked = -1;  // the process group generation of the last "step" line

  void one(int64_t step) {
    const int rank = pg.rank();
    if (step == opt.kill_step && rank == opt.kill_rank && pg.env().restart_count == 0 &&
        pg.generation() == 0) {
      std::cerr << "[train] rank " << rank << ": --kill-rank-at-step: SIGKILL at step " << step
                << std::endl;
      timeline.mark("fault", step);
      std::raise(SIGKILL);
    }
    auto idx = torch::tensor(stream.indices(step), torch::kLong);
    auto x = data.features.index_select(0, idx).to(device);
    auto y = data.labels.index_select(0, idx).to(device);
    loss = torch::nn::functional::cross_entropy(ddp(x), y);
    loss.backward();
  }

  void after(int64_t done) {
    const int rank = pg.rank();
    if (marked != pg.generation() ||  // the first step of this process, or since a recovery
        (opt.mark_every > 0 && done % opt.mark_every == 0)) {
      marked = pg.generation();
      timeline.mark("step", done);
    }
    if (done % opt.log_every == 0 || done == opt.steps) {
      auto global = loss.detach().reshape({1}).clone();
      pg.all_reduce(global, ddprun::ReduceOp::kAvg);
      if (rank == 0) {
        std::cout << "step " << done << "/" << opt.steps << " loss " << std::fixed
                  << std::setprecision(6) << global.item<double>() << std::defaultfloat
                  << std::endl;
      }
    }
    if (memory && rank == 0 && done % opt.memory_every == 0 && done < opt.steps) {
      ddprun::save_checkpoint(*memory, {0, done, run_settings}, *model, optimizer);
    }
    if (!opt.checkpoint.empty() && rank == 0 && done % opt.checkpoint_every == 0 &&
        done < opt.steps) {
      ddprun::save_checkpoint(checkpoint_file, {0, done, run_settings}, *model, optimizer);
      std::cout << "[train] checkpoint at step " << done << " -> " << checkpoint_file << std::endl;
    }
  }
};

int run(const Options& opt, const Timeline& timeline, double started) {
  // A standby (ddprun --in-process-recovery) entered main() long before it took a dead rank's
  // place in init_process_group(): it starts running then.
  const bool standby = std::getenv("DDPRUN_STANDBY_FD") != nullptr;
  ddprun::InitOptions init;
  init.backend = ddprun::parse_backend(opt.backend);
  if (opt.device == "cpu" && init.backend == ddprun::Backend::kAuto) {
    init.backend = ddprun::Backend::kGloo;
  }
  auto pg = ddprun::init_process_group(init);
  timeline.mark("script", -1, standby ? wall_seconds() : started);
  timeline.mark("pg_ready");
  const int rank = pg->rank(), world = pg->size();
  const torch::Device device = pick_device(opt, *pg);
  if (opt.global_batch % world != 0) {
    throw train::UsageError("--global-batch " + std::to_string(opt.global_batch) +
                            " is not divisible by the world size " + std::to_string(world));
  }
  const int64_t local_batch = opt.global_batch / world;

  Dataset data = make_dataset(opt.seed, opt.dataset_size, opt.features, opt.classes);
  torch::manual_seed(opt.seed);
  Mlp model(opt.features, opt.hidden, opt.classes);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(opt.lr).momentum(0.9));

  // The data order depends on these: a run may resume only a checkpoint written with the same.
  const std::map<std::string, int64_t> run_settings{{"global_batch", opt.global_batch},
                                                    {"seed", static_cast<int64_t>(opt.seed)}};
  const std::string checkpoint_file =
      opt.checkpoint.empty() ? "" : opt.checkpoint + "/checkpoint.pt";
  // The job's in-memory checkpoint (under ddprun) holds the last step; the file, an older one.
  const std::optional<std::string> memory =
      opt.memory_every > 0 ? ddprun::memory_checkpoint_path() : std::nullopt;
  const Resumed resumed =
      resume(*pg, {memory.value_or(""), checkpoint_file}, run_settings, *model, optimizer);
  const int64_t start = resumed.step;
  timeline.mark("restored", start);
  ddprun::DdpOptions ddp_options;
  ddp_options.compression = compression_of(opt.compression);
  ddprun::DistributedDataParallel ddp(model, pg, ddp_options);
  if (rank == 0) announce(opt, *pg, ddp, device, local_batch, resumed, checkpoint_file);
  BatchStream stream(data, world, rank, opt.seed, local_batch);

  Steps steps{opt, timeline, *pg,       data,   stream,          device,
              ddp, model,    optimizer, memory, checkpoint_file, run_settings};
  auto one_step = [&](int64_t step) { steps.one(step); };
  auto after_step = [&](int64_t done) { steps.after(done); };
  // The loop zeroes the gradients, steps the optimizer and, under ddprun --in-process-recovery,
  // survives another rank's death: the step that failed runs again (training_loop.hpp).
  // README training-loop begin
  ddprun::TrainingLoop loop(ddp, *model, optimizer);
  loop.run(start, opt.steps, one_step, after_step);
  // README training-loop end
  const double sum = checksum(*model);
  if (rank == 0) {
    std::cout << "final params checksum: " << std::setprecision(12) << sum << std::endl;
  }
  timeline.mark("done", opt.steps);
  return 0;
}

}  // namespace
}  // namespace train

int main(int argc, char** argv) {
  const double started = train::wall_seconds();  // the timeline's "script" phase
  train::Options opt;
  try {
    opt = train::parse_options(argc, argv);
  } catch (const train::UsageError& e) {
    std::cerr << "train: " << e.what() << "\n" << train::kUsage;
    return 2;
  }
  if (opt.help) {
    std::cout << train::kUsage;
    return 0;
  }
  return ddprun::record([&] {
    try {
      const train::Timeline timeline(opt.timeline);
      return train::run(opt, timeline, started);
    } catch (const train::UsageError& e) {
      std::cerr << "train: " << e.what() << "\n";
      return 2;
    }
  });
}
