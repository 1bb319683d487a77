// The worker's view of its job, read from the environment ddprun (or torchrun) gives it.
//
// Needs no LibTorch: this header and env.cpp compile on their own. Thread-safe: read_worker_env
// only reads the environment (do not setenv() concurrently).
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ddprun {

// Every error the SDK reports for a bad environment or a misuse: the message says what is wrong
// and, where there is one, which variable or parameter.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The variables of torchrun's worker contract (see the README for the full list).
struct WorkerEnv {
  int rank = 0;              // RANK: this worker's global rank
  int world_size = 1;        // WORLD_SIZE
  int local_rank = 0;        // LOCAL_RANK: rank on this node; picks the CUDA device
  int local_world_size = 1;  // LOCAL_WORLD_SIZE (defaults to WORLD_SIZE when unset)
  int group_rank = 0;        // GROUP_RANK: node rank (0 when unset)
  std::string master_addr;   // MASTER_ADDR: host of the store
  int master_port = 0;       // MASTER_PORT
  // TORCHELASTIC_USE_AGENT_STORE == "True": the launcher's agent hosts the store and every
  // worker is a client. Otherwise rank 0 hosts it, as with a plain `init_method="env://"`.
  bool use_agent_store = false;
  int restart_count = 0;   // TORCHELASTIC_RESTART_COUNT (0 when unset)
  int max_restarts = 0;    // TORCHELASTIC_MAX_RESTARTS (0 when unset)
  std::string run_id;      // TORCHELASTIC_RUN_ID (may be empty)
  std::string error_file;  // TORCHELASTIC_ERROR_FILE (may be empty)
};

// Looks a variable up; std::nullopt when unset. The default reads ::getenv.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

// Reads and validates the worker environment. Throws ddprun::Error naming the variable when a
// required one (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) is missing, or any is
// malformed or out of range (e.g. RANK >= WORLD_SIZE).
WorkerEnv read_worker_env(const EnvLookup& lookup = {});

}  // namespace ddprun
