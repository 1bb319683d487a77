// Zygote: warm start for Python workers. A Python process of the workers' interpreter and
// environment (the per-attempt variables aside) imports the modules a training script imports
// first (torch, torch.distributed, torch._dynamo by default), touching no accelerator, and then
// forks each worker on request, so a restarted worker skips seconds of imports. The forked
// worker is set up as a cold one (zygote_boot.py says how, and what a script could still tell
// apart: its parent process, the modules already in sys.modules, its str hash seed).
//
// The agent and the zygote talk over an AF_UNIX SOCK_SEQPACKET pair: one JSON message per
// datagram, descriptors as SCM_RIGHTS. The zygote parents the workers it forks: it reports each
// one's pidfd (no pid race) and, after killing what was left of its process group, its exit
// status. Closing the agent's end ends the zygote; a zygote that dies takes its workers with it
// (their parent-death signal), which the agent sees as their exits.
//
// Threads: the io_context thread only. spawn() and reap() wait for the zygote's answer, which it
// gives within milliseconds; a zygote that does not answer within kAnswerTimeout is broken.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "agent/process/child_process.hpp"
#include "agent/process/guardian.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent {

class ZygoteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ZygoteOptions {
  std::string python;                // the workers' interpreter (resolved path)
  std::string argv0;                 // its argv[0] as a cold worker gets it (sys.executable)
  size_t cmdline_room = 4096;        // bytes a worker's command line may take in /proc
  std::vector<std::string> modules;  // imported before the first fork
  std::vector<std::string>
      env;  // "NAME=value": the workers' environment, less the per-attempt part
  std::vector<int> reset_signals;  // as for a cold worker (child_process.hpp)
  std::string log_path;            // the zygote's own stdout and stderr
  Guardian* guardian = nullptr;    // told of the zygote's process group, when given
};

// One worker to fork: what `python -u <target> args...` (or `-m <target>`) would be.
struct ZygoteSpawn {
  bool module = false;
  std::string target;                  // the script's path, or the module's name
  std::vector<std::string> args;       // after the script or module
  std::vector<std::string> orig_argv;  // the cold command line (sys.orig_argv)
  std::vector<std::string> env;
  std::string cwd;
};

class Zygote final : public ChildReaper {
 public:
  static constexpr std::chrono::milliseconds kAnswerTimeout{5000};

  struct Ready {
    double import_s = 0;
    std::vector<std::string> modules;  // imported
    std::vector<std::string> missing;  // "name: ModuleNotFoundError: ..."
    int threads = 0;                   // the zygote's threads after importing (1: fork-safe)
    int64_t rss_kb = 0;                // its resident memory then
  };

  // Spawns the zygote, which starts importing; throws std::system_error if it cannot.
  explicit Zygote(ZygoteOptions options);
  // Ends the zygote (and whatever it still parents) and reaps it.
  ~Zygote();
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  // Without waiting: nullopt while it imports; its report once it is ready. failed() once it
  // died or broke the protocol (why: failure()).
  const std::optional<Ready>& ready();
  bool failed() const { return !failure_.empty(); }
  const std::string& failure() const { return failure_; }
  pid_t pid() const { return child_ ? child_->pid() : -1; }

  // Forks a worker with `stdout_fd` and `stderr_fd` as its 1 and 2.
  // Throws ZygoteError (the zygote is broken then: start this worker cold).
  ChildProcess spawn(const ZygoteSpawn& request, int stdout_fd, int stderr_fd);
  // The exit status of a worker it forked, once it reported it (waits up to kAnswerTimeout; a
  // broken zygote's workers are reported killed).
  ExitStatus reap(pid_t pid, uint64_t& peak_rss_kb) override;

 private:
  struct Message {
    std::string json;
    std::vector<sys::UniqueFd> fds;
  };
  // The next message; nullopt on timeout, EOF or an error (then failure_ says why).
  std::optional<Message> receive(std::chrono::milliseconds timeout);
  void send(const std::string& json, const std::vector<int>& fds);
  // Files a message: ready, an exit status (kept for reap), or returns it (spawned / error).
  std::optional<Message> file(Message m);
  void fail(const std::string& why);

  ZygoteOptions options_;
  sys::UniqueFd control_;
  std::optional<ChildProcess> child_;
  std::optional<Ready> ready_;
  std::map<pid_t, std::pair<ExitStatus, uint64_t>> exits_;  // reported (and the peak rss in
                                                            // KiB), not yet reaped
  std::string failure_;
};

}  // namespace ddprun::agent
