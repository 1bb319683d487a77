// What each worker of an attempt is started with: its argv (${local_rank} substituted), its
// environment (worker_env.hpp) and where its stdout/stderr go (inherited, /dev/null, a log
// file, or tee'd to a file and the console with torchrun's line prefix), from the WorkerSpec's
// log settings and the attempt's log directory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "agent/process/process_context.hpp"
#include "agent/worker_group.hpp"

namespace ddprun::agent {

// One per attempt: --duplicate-{stdout,stderr}-filters write into one shared file each.
struct FilteredFiles {
  std::shared_ptr<sys::UniqueFd> out;
  std::shared_ptr<sys::UniqueFd> err;
};

// Throws std::system_error when a filtered_*.log cannot be created.
std::vector<WorkerLaunch> make_launches(const WorkerGroup& group, const std::string& attempt_dir,
                                        FilteredFiles& filtered);

}  // namespace ddprun::agent
