// EventLog: --event-log=FILE, one JSON object per line for everything that happens to the
// job on this node, for a person or a log pipeline to read after the fact. Every line has
//   "time"  (unix seconds, float),  "job" (the run id),  "host",  "agent_pid",  "event"
// and the event's own fields:
//   transition     from, to, on (the event), action, round, restart_count, max_restarts,
//                  world_size [, reason]
//   round          round, group_rank, group_world_size, world_size, restart_count,
//                  members, took_s (how long the rendezvous took)
//   worker_start   local_rank, rank, pid, attempt
//   worker_exit    local_rank, rank, pid, exit_code | signal (name), attempt
//   hang           local_rank, rank, pid, kind, reason, stacks (the file), stacks_s (how
//                  long capturing them took), attempt
//   exit_hang      local_rank, rank, pid, reason, stacks
//   restart        attempt, restart_count, max_restarts
//   job_end        result, exit reason, attempts, restarts, reformations, hangs, wall_s
// The file is opened for appending (several agents may share it) and each line is written
// with one write(2), so lines never interleave. A write error disables the log with one
// warning; it never stops the job.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "store/sys/fd.hpp"

namespace ddprun::agent {

class EventLog {
 public:
  EventLog() = default;  // disabled: emit() does nothing
  // Opens (creates) `path` for appending; throws std::system_error naming it.
  EventLog(const std::string& path, std::string job_id);

  bool enabled() const { return static_cast<bool>(fd_); }
  // Adds the common fields to `fields` and writes the line.
  void emit(const char* event, nlohmann::json fields);

 private:
  sys::UniqueFd fd_;
  std::string job_id_;
  std::string path_;
};

}  // namespace ddprun::agent
