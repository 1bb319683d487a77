// Flags a batch scheduler implies, so that `srun ddprun --nproc-per-node=8 train.py` needs no
// other flag. Precedence, flag by flag: the command line, then PET_<FLAG>, then what the
// scheduler's variables imply (this file), then torchrun's defaults.
//
// Slurm, inside an srun step only (SLURM_JOB_ID and SLURM_STEP_ID set): a batch script or an
// salloc shell also has SLURM_JOB_*, SLURM_NODEID and SLURM_PROCID (Slurm 22.05 sets them in
// the batch step) but no SLURM_STEP_ID; it is one process on one node, and deriving
// --nnodes=N there would make a lone ddprun wait for N-1 nodes that never come. There nothing
// is derived and the notice says so.
//   --nnodes       SLURM_STEP_NUM_NODES (else SLURM_NNODES)
//   --node-rank    SLURM_NODEID (the node's index in the step)
//   --master-addr  the first host of SLURM_STEP_NODELIST (else SLURM_NODELIST,
//                  SLURM_JOB_NODELIST), whose size must equal the node count
//   --master-port  slurm_master_port(SLURM_JOB_ID)
//   --rdzv-id      SLURM_JOB_ID
//   --rdzv-endpoint  with --rdzv-backend=c10d only: the master address and port
// The static rendezvous (node 0 hosts the store) fits a step: Slurm starts exactly the step's
// nodes and numbers them, so no node need wait for others to arrive in some order.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/cli_parser.hpp"

namespace ddprun::launcher {

struct DerivedFlag {
  std::string name;    // canonical flag name, e.g. "node_rank"
  std::string value;   // as it would be written after --flag=
  std::string source;  // the variable(s) it came from, for the notice and error messages
};

struct SchedulerFlags {
  std::vector<DerivedFlag> flags;  // only flags not in `given`
  std::string notice;              // one line for the log, or empty
  std::string error;               // one line (exit 2), set only when a derived flag is needed
};

// `given`: canonical names of the flags the command line or PET_* set; `backend`: the
// rendezvous backend they chose (static by default); `standalone`: --standalone (then
// nothing is derived: one node). Pure: reads only through `getenv`.
SchedulerFlags derive_scheduler_flags(const GetEnv& getenv, const std::set<std::string>& given,
                                      agent::Backend backend, bool standalone);

// The master port of a Slurm job, the same on every node: 15000 + job_id % 10000, so within
// 15000-24999, below Linux's ephemeral ports (32768-60999) and away from torchrun's 29400 and
// 29500.
int slurm_master_port(unsigned long long job_id);

// The GPUs Slurm gave this step's node (SLURM_GPUS_ON_NODE), inside a step; nullopt otherwise.
std::optional<int> slurm_gpus_on_node(const GetEnv& getenv);

}  // namespace ddprun::launcher
