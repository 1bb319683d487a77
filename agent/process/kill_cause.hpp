// KillCauses: why a worker died of SIGKILL, said in one line a person can act on. A bare
// "exitcode -9" is almost always the kernel's OOM killer, but not always; the answer names
// who sent it and the memory figures that matter:
//
//   killed by the kernel's OOM killer (rss 1.1 GiB; memory cgroup /job at its limit of
//   1.0 GiB; node 10.3 of 23.5 GiB in use)
//   killed by ddprun: SIGKILL after the stop grace expired (peak rss 80.2 MiB)
//   killed by SIGKILL from outside ddprun, not by the OOM killer (peak rss 80.2 MiB)
//
// The evidence, from every source the machine offers (sources() names those it has and why
// the others are missing):
//   - the kernel log (/dev/kmsg: root, or kernel.dmesg_restrict=0), read from where it ended
//     when the agent started. For every kill the OOM killer logs "oom-kill:...,oom_memcg=<cg>,
//     task_memcg=<cg>,task=<comm>,pid=<pid>,uid=<uid>" and "<...>: Killed process <pid>
//     (<comm>) total-vm:<n>kB, anon-rss:<n>kB, file-rss:<n>kB, shmem-rss:<n>kB, ...".
//     The pids are those of the kernel's first pid namespace; a container seldom may read the
//     log, and one that may would take the OOM kill of a host process that has its worker's
//     pid for the worker's (since the worker started: a rare coincidence).
//   - the worker's memory cgroup (cgroup v2 memory.events, v1 memory.oom_control: the
//     "oom_kill" count, kernel 4.13+): read when the worker starts and when it has died; a
//     rise while it died of SIGKILL is an OOM kill in its cgroup. The cgroup is the one the
//     worker started in (a dead process's /proc/<pid>/cgroup names the root): one that moves
//     itself elsewhere is judged by the kernel log alone.
//   - the node's count (/proc/vmstat oom_kill), the weakest: an OOM kill somewhere on the node
//     at the time, named as such.
// Nothing here polls: the sources are read when a worker starts and when it has died.
//
// Threads: the agent's.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "store/sys/fd.hpp"

namespace ddprun::agent {

// One kill the kernel's OOM killer logged.
struct OomKillRecord {
  pid_t pid = 0;
  uint64_t rss_kb = 0;  // anon + file + shmem at the kill
  std::string memcg;    // the cgroup whose limit was hit (oom_memcg); empty: the node's memory
};

// Parses one kernel log message; fills `into` with what it says about an OOM kill (either of
// the two lines), keyed by pid. Returns whether it was one.
bool parse_oom_log_line(std::string_view message, std::map<pid_t, OomKillRecord>& into);

// A process's memory cgroup from the text of /proc/<pid>/cgroup: the v1 memory controller's
// path, else the v2 path. Version 0: none.
struct CgroupRef {
  int version = 0;
  std::string path;  // relative to the hierarchy's mount point, "/" for the root
};
CgroupRef parse_proc_cgroup(std::string_view text);

// A running process's resident set now and at its peak (/proc/<pid>/status VmRSS, VmHWM).
struct ProcessMemory {
  uint64_t rss_kb = 0;
  uint64_t peak_rss_kb = 0;
};
std::optional<ProcessMemory> read_process_memory(pid_t pid);

// Memory figures of the worker, node and cgroup, as the one-line summary shows them.
std::string format_bytes(uint64_t bytes);  // "1.1 GiB", "80.2 MiB", "512 KiB"

class KillCauses {
 public:
  // Opens the kernel log at its end and notes which sources this machine offers.
  // `cgroup_root`: where the hierarchies are mounted (tests give another).
  explicit KillCauses(std::string cgroup_root = "/sys/fs/cgroup");

  // A worker started: records its memory cgroup and that cgroup's OOM-kill count.
  void started(pid_t pid);
  // The worker `pid` died of SIGKILL: the cause, one line.
  // `sent_by_ddprun`: the agent sent it SIGKILL (what for, e.g. "after the stop grace
  // expired"; empty: it did not). `peak_rss_kb`: from its rusage, 0 when unknown.
  std::string explain(pid_t pid, const std::string& sent_by_ddprun, uint64_t peak_rss_kb);
  // The worker is gone: forget what was recorded for it.
  void forget(pid_t pid);

  // "kernel log, memory cgroup v1" or, for each missing one, why.
  const std::string& sources() const { return sources_; }

 private:
  struct Watched {
    CgroupRef cgroup;
    std::optional<uint64_t> oom_kills;       // the cgroup's count when the worker started
    std::optional<uint64_t> node_oom_kills;  // the node's
  };
  void read_kernel_log();
  std::optional<uint64_t> cgroup_oom_kills(const CgroupRef& cg) const;
  std::optional<uint64_t> cgroup_limit(const CgroupRef& cg) const;
  std::string cgroup_dir(const CgroupRef& cg) const;

  std::string cgroup_root_;
  sys::UniqueFd kmsg_;
  std::string sources_;
  std::map<pid_t, OomKillRecord> oom_kills_;  // what the kernel log said, by pid
  std::map<pid_t, Watched> watched_;
};

}  // namespace ddprun::agent
