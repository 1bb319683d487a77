// MemoryCheckpoints: the job's memory that outlives its workers. A directory on a tmpfs
// (/dev/shm), private to the job's user (mode 0700), that the workers save their checkpoints
// to (DDPRUN_MEMORY_CHECKPOINT_DIR; the worker SDK's and the Python `ddprun` module's memory
// target) so that a restarted worker restores from memory instead of a file system: a save is
// a memory copy, cheap enough for every step.
//
// The bound (DDPRUN_MEMORY_CHECKPOINT_LIMIT, bytes) is kept by the savers, which refuse a save
// that would pass it; the agent reports the use. A save is atomic: the savers write a temp
// file (".<name>.<pid>.tmp" from Python, "<name>.tmp.<pid>" from C++) and rename it, so a
// reader finds a complete checkpoint or the previous one (Python swaps the two and keeps the
// previous save's file to write the next one into); the temp files are removed before each
// attempt starts.
// The directory goes with the job: the agent removes it when it ends, and the orphan guardian
// when the agent was killed. Where both were killed at once (a whole process tree, an OOM kill
// of the cgroup), the next agent of the same user on the node removes it: each agent holds an
// flock on its directory while it lives, and removes the ddprun directories nobody holds.
//
// Threads: the agent's.
#pragma once

#include <cstdint>
#include <string>

#include "store/sys/fd.hpp"

namespace ddprun::agent {

class Guardian;

// What the regular files under `dir` (and its subdirectories) take on disk or tmpfs.
uint64_t bytes_under(const std::string& dir);

class MemoryCheckpoints {
 public:
  // Creates <base>/ddprun-<run_id>-<random>/ with room for `limit_bytes` (capped to what the
  // tmpfs has free). Throws std::runtime_error saying why when it cannot.
  MemoryCheckpoints(const std::string& run_id, uint64_t limit_bytes, Guardian* guardian,
                    const std::string& base = "/dev/shm");
  ~MemoryCheckpoints();  // removes the directory and what is in it
  MemoryCheckpoints(const MemoryCheckpoints&) = delete;
  MemoryCheckpoints& operator=(const MemoryCheckpoints&) = delete;

  const std::string& path() const { return path_; }
  uint64_t limit() const { return limit_; }
  uint64_t used_bytes() const;  // what the files in it hold now
  // Removes the temp files of saves that never finished. Call when no worker runs.
  void remove_partial_saves();

 private:
  std::string path_;
  sys::UniqueFd lock_;  // the directory, flock()ed while this agent lives
  uint64_t limit_ = 0;
  Guardian* guardian_;
};

}  // namespace ddprun::agent
