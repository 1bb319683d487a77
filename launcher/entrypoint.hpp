// How ddprun turns the entrypoint into the worker command (launcher/README.md, "The entrypoint"):
//   script.py       -> $PYTHON_EXEC (else python3) -u script.py ARGS   (the file must exist)
//   -m module       -> $PYTHON_EXEC (else python3) -u -m module ARGS
//   --no-python P   -> P ARGS                                          (P must be executable)
//   anything else   -> exec'd directly if it is an executable file: a path ("./train"), a
//                      name on PATH ("train"), or an executable file in the current directory
// A missing or non-executable entrypoint is a CliError, so nothing is started.
#pragma once

#include <string>
#include <vector>

#include "agent/worker_spec.hpp"
#include "launcher/cli_parser.hpp"
#include "launcher/launch_config.hpp"

namespace ddprun::launcher {

struct WorkerCommand {
  std::string program;            // resolved path for execve
  std::string argv0;              // as the user named it
  std::vector<std::string> args;  // argv[1..], ${local_rank} not yet substituted
  std::string name;               // title of the failure summary
  // A Python entrypoint: where the script or module is in argv (see WorkerSpec::python).
  std::optional<agent::WorkerSpec::PythonEntry> python;
};

WorkerCommand resolve_entrypoint(const LaunchConfig& config, const GetEnv& getenv);

// execvp's lookup: a name containing '/' is used as is, else searched in PATH. Returns the
// path of an executable regular file, or "" if there is none.
std::string find_executable(const std::string& name, const GetEnv& getenv);

}  // namespace ddprun::launcher
