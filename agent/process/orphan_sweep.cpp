#include "agent/process/orphan_sweep.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "agent/process/proc_stat.hpp"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr auto kPause = std::chrono::milliseconds(5);  // between rounds, for kills to land

// This process's children: every thread's `children` list, else a scan of /proc.
std::vector<pid_t> children() {
  std::vector<pid_t> out;
  std::error_code ec;
  bool listed = false;
  for (const auto& task : fs::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(task.path() / "children");
    if (!in) continue;
    listed = true;
    pid_t pid;
    while (in >> pid) out.push_back(pid);
  }
  if (listed) return out;
  const pid_t self = ::getpid();
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str()));
    const auto fields = proc_stat_fields(pid);  // [0] state, [1] ppid
    if (fields.size() > 1 && std::atol(fields[1].c_str()) == self) out.push_back(pid);
  }
  return out;
}

std::string name_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name.empty() ? "?" : name;
}

// Reaps `pid` if it has exited; true then.
bool reap_if_exited(pid_t pid) {
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    return errno == ECHILD;  // not ours (any more)
  }
  if (info.si_pid == 0) return false;
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  return true;
}

}  // namespace

bool become_subreaper() {
  return ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0;
}

bool is_subreaper() {
  int on = 0;
  return ::prctl(PR_GET_CHILD_SUBREAPER, &on, 0, 0, 0) == 0 && on != 0;
}

boost::asio::awaitable<std::vector<std::string>> sweep_orphans(boost::asio::io_context& io,
                                                               std::set<pid_t> own,
                                                               std::chrono::milliseconds limit) {
  std::vector<std::string> killed;
  std::set<pid_t> signalled;
  const auto deadline = Clock::now() + limit;
  for (;;) {
    bool waiting = false;
    for (pid_t pid : children()) {
      if (own.count(pid) || reap_if_exited(pid)) continue;
      waiting = true;
      if (signalled.insert(pid).second) {
        killed.push_back("pid " + std::to_string(pid) + " (" + name_of(pid) + ")");
        ::kill(pid, SIGKILL);
      }
    }
    if (!waiting || Clock::now() >= deadline) break;
    boost::asio::steady_timer pause(io, kPause);
    boost::system::error_code ec;
    co_await pause.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
  }
  co_return killed;
}

}  // namespace ddprun::agent
