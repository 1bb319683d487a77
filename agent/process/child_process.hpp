// ChildProcess: one worker process and its process group, spawned with clone+exec (or adopted:
// forked by the warm-start zygote, which reaps it and reports its exit status).
//
// The child is cloned like vfork (CLONE_VM | CLONE_VFORK: it shares the agent's memory, on a
// stack of its own, and the agent waits until it has exec'd), so a spawn costs the same with
// 2 workers as with 2,000 and their buffers. It makes only system calls between clone and
// execve, writing nothing of the agent's memory: it resets the signals
// the agent handles or ignores, starts a new session (so it leads its own process group and,
// like torchrun 2.x's start_new_session, never gets SIGTTIN/SIGTTOU from the terminal), asks
// the kernel to SIGKILL it when the agent dies (PR_SET_PDEATHSIG, with the getppid() race
// check), dup2s its stdout/stderr, closes every other descriptor and execs.
//
// Ownership: a ChildProcess owns the process until it is reaped. Destroying one that was not
// reaped SIGKILLs its whole process group and reaps it (blocking; SIGKILL is immediate).
// Single-threaded: call from the agent's thread only.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "agent/process/exit_status.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent {

// `strings` as the null-terminated array execve takes (pointing into `strings`).
inline std::vector<char*> c_array(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

struct SpawnRequest {
  const char* path = nullptr;   // execve path (already resolved)
  char* const* argv = nullptr;  // null-terminated
  char* const* envp = nullptr;  // null-terminated
  int stdin_fd = -1;            // dup2'd onto 0 when >= 0, else inherited
  int stdout_fd = -1;           // dup2'd onto 1 when >= 0, else inherited
  int stderr_fd = -1;           // dup2'd onto 2 when >= 0, else inherited
  // Signals whose disposition the agent changed (handled or ignored): back to SIG_DFL.
  std::vector<int> reset_signals;
  int pass_fd = -1;  // when >= 0: the child gets it as descriptor 4 (e.g. a control socket)
};

// Who reaps a process the agent did not fork itself (a worker forked by the warm-start
// zygote, zygote.hpp): waits for its exit status, after killing what is left of its group.
class ChildReaper {
 public:
  // The exit status of `pid`, and its peak resident set (KiB, 0 when unknown).
  virtual ExitStatus reap(pid_t pid, uint64_t& peak_rss_kb) = 0;

 protected:
  ~ChildReaper() = default;
};

class ChildProcess {
 public:
  // Clones and execs; throws std::system_error if clone or pidfd_open fails. A failing execve
  // is reported by the child on its stderr and, through a close-on-exec pipe, to reap().
  static ChildProcess spawn(const SpawnRequest& request);
  // A process another one forked (it leads its own process group): `pidfd` is its pidfd,
  // `reaper` (which must outlive it) reports its exit status.
  static ChildProcess adopt(pid_t pid, sys::UniqueFd pidfd, ChildReaper* reaper);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&&) = delete;
  ChildProcess(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  bool reaped() const { return reaped_; }
  // The pidfd (readable once the process exited). The caller takes ownership.
  sys::UniqueFd take_pidfd() { return std::move(pidfd_); }
  // Whether the process of `pidfd` has exited (the pidfd is readable), without waiting.
  // An asio wait on a pidfd is a hint, not a proof: check this before reaping. A forked
  // child (the guardian's replacement, a zygote's, any fork of a library) holds a copy of
  // each agent descriptor until it closes them; one that the agent closes meanwhile stays in
  // the event loop's epoll set (epoll drops a registration only with the last copy of the
  // open file), and asio, which recycles its per-descriptor records, can hand that dead
  // descriptor's events to another one's wait.
  static bool has_exited(int pidfd);

  // Sends `sig` to the process group (no-op once reaped: the id may be reused).
  void signal_group(int sig) const;

  // Call once the process has exited (pidfd readable). While the leader is still a zombie
  // (so its pid, which is the group id, cannot be reused), SIGKILLs whatever is left in its
  // process group — grandchildren such as DataLoader workers — then reaps it.
  ExitStatus reap();
  // Its peak resident set in KiB (its rusage), once reaped; 0 when unknown.
  uint64_t peak_rss_kb() const { return peak_rss_kb_; }

 private:
  ChildProcess(pid_t pid, sys::UniqueFd pidfd, sys::UniqueFd exec_error)
      : pid_(pid), pidfd_(std::move(pidfd)), exec_error_(std::move(exec_error)) {}
  pid_t pid_ = -1;
  sys::UniqueFd pidfd_;
  sys::UniqueFd exec_error_;  // read end: the child's errno if its execve failed
  bool reaped_ = false;
  uint64_t peak_rss_kb_ = 0;
  ChildReaper* reaper_ = nullptr;  // adopted: not our child
};

}  // namespace ddprun::agent
