// RunLogDir: the job's log directory, torchrun's layout:
//   <log_dir>/<run_id>_<random>/attempt_<N>/<local_rank>/{stdout.log,stderr.log,error.json}
// and attempt_<N>/flight_recorder/ (flight_recorder_dir below).
// Earlier attempts' directories are kept (torchrun deletes an attempt's logs when a
// membership change repeats its number; ddprun then uses attempt_<N>.1, attempt_<N>.2, ...).
#pragma once

#include <string>

namespace ddprun::agent {

class RunLogDir {
 public:
  // Creates <base>/<run_id>_<8 random chars>. An empty `base` means a new temporary
  // directory ($TMPDIR or /tmp, "ddprun_XXXXXX"). Throws std::system_error naming the path.
  RunLogDir(const std::string& base, const std::string& run_id);

  const std::string& path() const { return path_; }
  bool temporary() const { return temporary_; }

  // Creates attempt_<N>/ (attempt_<N>.<k> if it exists), one directory per local rank and the
  // flight-recorder directory; returns its path.
  std::string make_attempt(int restart_count, int local_world_size) const;

  // Removes the temporary base directory and everything in it (no-op for a user's --log-dir).
  void remove_temporary();

 private:
  std::string base_;
  std::string path_;
  bool temporary_ = false;
};

// The workers' flight-recorder directory in an attempt's log directory: DDPRUN_FLIGHT_RECORDER
// (the agent's requests, the answers of ddprun/flight_recorder.py: rank_<RANK>.json) and torch's
// own dumps (TORCH_FR_DUMP_TEMP_FILE=<dir>/rank_, unless the user set it).
std::string flight_recorder_dir(const std::string& attempt_dir);
// The in-process recovery directory of an attempt (DDPRUN_RECOVERY_DIR: the agent's notices,
// the workers' answers; agent/in_process_recovery.hpp). Made by the agent when asked for.
std::string recovery_dir(const std::string& attempt_dir);

}  // namespace ddprun::agent
