// Command line of the `train` example. No LibTorch here.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace train {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  int64_t steps = 0;         // --steps N (required)
  int64_t global_batch = 0;  // --global-batch B (required), split evenly across ranks
  uint64_t seed = 0;         // --seed S: data, initial weights, shuffling
  std::string checkpoint;    // --checkpoint DIR: rank 0 writes DIR/checkpoint.pt; resume from it
  int64_t checkpoint_every = 20;
  // --memory-every K: under ddprun, rank 0 also saves to the job's in-memory checkpoint every
  // K steps (0: never), and a restart resumes from it before the file.
  int64_t memory_every = 1;
  int64_t log_every = 20;
  double lr = 0.05;
  int64_t dataset_size = 65536;
  int64_t features = 64;
  int64_t hidden = 256;
  int64_t classes = 10;
  std::string backend = "auto";      // auto | gloo | nccl
  std::string device = "auto";       // auto | cpu | cuda
  std::string compression = "none";  // none | fp16 | bf16
  // Fault injection for tests: SIGKILL rank R at the start of step S, first attempt only.
  int kill_rank = -1;
  int64_t kill_step = -1;
  // --timeline FILE: append one JSON line per phase (script, pg_ready, restored, step, fault,
  // done) with the wall-clock time, for tests/bench/recovery.
  std::string timeline;
  // --mark-every K: also a "step" line every K steps, not only the first (0), for the step
  // times of tests/bench/recovery --step-cost.
  int64_t mark_every = 0;
  bool help = false;
};

extern const char* const kUsage;

// Throws UsageError with a one-line message on a bad command line.
Options parse_options(int argc, const char* const* argv);

}  // namespace train
