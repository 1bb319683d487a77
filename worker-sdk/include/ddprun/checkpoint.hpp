// Checkpoints for elastic restarts: rank 0 saves, every rank loads, a crash never tears a file.
//
//   ddprun::TrainingProgress progress;                       // epoch 0, step 0: a fresh start
//   if (auto saved = ddprun::load_checkpoint(*pg, path, *model, optimizer)) progress = *saved;
//   for (int64_t epoch = progress.epoch; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);
//     ... train ...
//     if (pg->rank() == 0) ddprun::save_checkpoint(path, {epoch + 1, step}, *model, optimizer);
//   }
//
// A checkpoint is one file holding the model's parameters and buffers, the optimizer's state
// (SGD momentum buffers, Adam moments, ...), the progress counters and any named integers the
// caller adds: in LibTorch's archive format (torch::serialize::OutputArchive) on a disk, in a
// raw layout in the job's in-memory directory (memory_checkpoint_path below). load_checkpoint
// reads either.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "ddprun/process_group.hpp"

namespace ddprun {

// Where training stands. What "epoch" and "step" count is the caller's choice; the usual one:
// `epoch` is the next epoch to run (pass it to DistributedSampler::set_epoch), `step` the
// optimizer steps completed.
struct TrainingProgress {
  int64_t epoch = 0;
  int64_t step = 0;
  // Settings a resumed run must share with the one that saved (seed, global batch size...).
  std::map<std::string, int64_t> extra;
};

// Writes `model`'s and `optimizer`'s state and `progress` to `path` atomically: the bytes go to
// a temp file in the same directory, which is fsynced, renamed over `path`, and the directory
// is fsynced. A reader (or a restart after a crash, even a power loss) finds either the previous
// checkpoint or this one, complete. Creates missing parent directories and removes temp files
// that crashed saves left. Not a collective: call it on one rank (rank 0). Throws ddprun::Error
// naming the file when it cannot be written; the previous checkpoint is then left as it was.
void save_checkpoint(const std::string& path, const TrainingProgress& progress,
                     const torch::nn::Module& model, const torch::optim::Optimizer& optimizer);

// Collective (every rank calls it, same `path`): rank 0 reads `path` and broadcasts it, every
// rank restores `model` and `optimizer` from it onto pg.device() (Python's map_location), so
// ranks need no shared file system and always agree on whether to resume. Returns the progress
// saved, or nullopt when `path` does not exist (start fresh; model and optimizer untouched).
// Throws ddprun::Error naming the file, on every rank, when it is unreadable, truncated, corrupt
// or does not fit `model`/`optimizer` (the error names the parameter whose shape differs).
//
// The model is restored in place, as Python's load_state_dict does: the saved values are copied
// into the existing parameter and buffer tensors, which stay the same tensors. So it may be
// called before or after wrapping the model in DistributedDataParallel, with a plain optimizer
// or a ZeroRedundancyOptimizer (parameters_as_bucket_view too), hooks and Join alike.
// (LibTorch's own Module::load replaces each parameter's storage instead: see
// data_parallel.hpp for what DDP does when that happens under it.)
std::optional<TrainingProgress> load_checkpoint(ProcessGroup& pg, const std::string& path,
                                                torch::nn::Module& model,
                                                torch::optim::Optimizer& optimizer);

// The in-memory target: `name` in the job's in-memory checkpoint directory, which ddprun keeps
// on a tmpfs for as long as the job runs, across restarts (DDPRUN_MEMORY_CHECKPOINT_DIR,
// --memory-checkpoints); nullopt when there is none (not under ddprun, or turned off). Save to
// it and load from it as to a file: a save is a memory copy, cheap enough for every step, with
// the same atomicity. A save there that would pass the job's bound throws ddprun::Error and
// leaves the previous one. Memory is per node and a new node has none: keep a file checkpoint
// too, and load it when the memory one is missing.
//
// A save there is written in a raw layout (a short header, then each tensor's bytes as they lie
// in memory: one copy, where LibTorch's archive pickles, zips and checksums) into the pages of
// the save before the last, which the rename swaps out (so the name holds up to twice the
// state) and the process keeps mapped, without an fsync (no disk is under it). A tmpfs without
// room for a save is an error from the save (its pages are got before the copy). The layout is for the processes of one job:
// same build, same byte order. SGD, Adam, AdamW, Adagrad and RMSprop are held in it whole,
// their parameter groups' options (the learning rate a scheduler changed) included, as Python's
// load_state_dict restores them; any other optimizer (ZeroRedundancyOptimizer, your own) goes
// in its own archive inside it, and LibTorch's load of that keeps the optimizer's options.
//
//   auto memory = ddprun::memory_checkpoint_path();
//   auto saved = memory ? ddprun::load_checkpoint(*pg, *memory, *model, opt) : std::nullopt;
//   if (!saved) saved = ddprun::load_checkpoint(*pg, "/ckpt/last.pt", *model, opt);
//   ...
//   if (memory && pg->rank() == 0) ddprun::save_checkpoint(*memory, {0, step}, *model, opt);
//
// Throws ddprun::Error for a name that is not a plain file name.
std::optional<std::string> memory_checkpoint_path(const std::string& name = "checkpoint.pt");

}  // namespace ddprun
