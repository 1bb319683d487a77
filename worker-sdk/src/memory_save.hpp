// Saves to the job's in-memory checkpoint directory (a tmpfs): the raw layout copied into the
// mapped pages of the save before the last one, which then takes the last one's place.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "training_state.hpp"

namespace ddprun::detail {

// Throws ddprun::Error "checkpoint PATH: WHAT[: strerror(err)]".
[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what, int err = 0);

// Bytes the regular files in `dir` hold (their memory pages), but for `a` and `b`.
uint64_t memory_used_besides(const std::filesystem::path& dir, const std::filesystem::path& a,
                             const std::filesystem::path& b);

// Throws the error of a save of `bytes` to `target` that the job's bound `limit` refuses.
[[noreturn]] void fail_over_bound(const std::filesystem::path& target, uint64_t bytes,
                                  uint64_t used, uint64_t limit);

// Writes `raw` to `target` (in the in-memory directory) atomically; `limit` is the job's bound
// on the directory (0: none). Thread-safe.
void save_in_memory(const std::filesystem::path& target, const RawTrainingState& raw,
                    uint64_t limit);

}  // namespace ddprun::detail
