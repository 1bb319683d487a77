#include "launcher/entrypoint.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include "store/sys/path_search.hpp"

namespace ddprun::launcher {
namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

WorkerCommand python_command(const LaunchConfig& c, const GetEnv& getenv) {
  WorkerCommand cmd;
  auto python = getenv("PYTHON_EXEC");
  cmd.argv0 = python && !python->empty() ? *python : "python3";
  cmd.program = find_executable(cmd.argv0, getenv);
  if (cmd.program.empty()) {
    throw CliError("cannot find the Python interpreter '" + cmd.argv0 + "'" +
                   (python && !python->empty() ? " (from PYTHON_EXEC)"
                                               : " on PATH (set PYTHON_EXEC to choose one)"));
  }
  cmd.args.push_back("-u");
  if (c.module) cmd.args.push_back("-m");
  cmd.args.push_back(c.entrypoint);
  cmd.python = agent::WorkerSpec::PythonEntry{c.module, cmd.args.size()};  // argv[0] comes first
  cmd.args.insert(cmd.args.end(), c.entrypoint_args.begin(), c.entrypoint_args.end());
  cmd.name = c.entrypoint;
  return cmd;
}

}  // namespace

std::string find_executable(const std::string& name, const GetEnv& getenv) {
  auto path = getenv("PATH");
  return sys::find_on_path(name, path ? *path : "/usr/local/bin:/usr/bin:/bin",
                           sys::EmptyEntry::kCurrentDirectory)
      .value_or("");
}

WorkerCommand resolve_entrypoint(const LaunchConfig& c, const GetEnv& getenv) {
  const std::string& entry = c.entrypoint;
  if (c.module) return python_command(c, getenv);
  // torchrun's --run-path runs the script with runpy in a worker process of its own, whatever
  // its name: here it runs in a python3 -u of its own, which no script can tell apart.
  if (!c.no_python && (entry.ends_with(".py") || c.run_path)) {
    if (!exists(entry)) throw CliError("the script " + entry + " does not exist");
    if (::access(entry.c_str(), R_OK) != 0)
      throw CliError("the script " + entry + " is not readable");
    return python_command(c, getenv);
  }
  WorkerCommand cmd;
  cmd.argv0 = entry;
  cmd.args = c.entrypoint_args;
  cmd.name = entry;
  cmd.program = find_executable(entry, getenv);
  if (cmd.program.empty() && entry.find('/') == std::string::npos &&
      sys::is_executable_file("./" + entry)) {
    cmd.program = "./" + entry;  // an executable in the current directory, as torchrun finds it
  }
  if (!cmd.program.empty()) return cmd;
  std::string where = entry.find('/') == std::string::npos && !exists(entry) ? " on PATH" : "";
  if (exists(entry)) {
    throw CliError("the entrypoint " + entry +
                   " is not executable (chmod +x it; Python "
                   "scripts must end in .py or be run with -m)");
  }
  throw CliError("the entrypoint " + entry + " was not found" + where +
                 " (a script.py, -m module, or an executable program)");
}

}  // namespace ddprun::launcher
