#include "agent/process/standby.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "agent/process/fd_passing.hpp"
#include "agent/process/guardian.hpp"

namespace ddprun::agent {

Standby::Standby(const std::string& program, std::vector<std::string> argv,
                 std::vector<std::string> env, const std::vector<int>& reset_signals,
                 Guardian* guardian)
    : argv_(std::move(argv)), guardian_(guardian) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    throw std::system_error(errno, std::generic_category(), "socketpair");
  }
  control_.reset(pair[0]);
  sys::UniqueFd theirs(pair[1]);
  sys::UniqueFd null(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  env.push_back("DDPRUN_STANDBY_FD=4");
  std::vector<std::string> args = argv_;
  auto cargv = c_array(args);
  auto cenv = c_array(env);
  SpawnRequest req;
  req.path = program.c_str();
  req.argv = cargv.data();
  req.envp = cenv.data();
  req.stdout_fd = null.get();
  req.stderr_fd = null.get();
  req.reset_signals = reset_signals;
  req.pass_fd = theirs.get();
  child_.emplace(ChildProcess::spawn(req));
  if (guardian_) guardian_->watch(child_->pid());
}

Standby::~Standby() {
  control_.reset();
  if (!child_ || child_->reaped()) return;
  const pid_t pid = child_->pid();
  child_->signal_group(SIGKILL);
  child_.reset();  // reaps it
  if (guardian_) guardian_->unwatch(pid);
}

std::optional<ChildProcess> Standby::take(const std::vector<std::string>& env, int stdout_fd,
                                          int stderr_fd) {
  if (!child_) return std::nullopt;  // a dead one: the send below fails (EPIPE)
  std::string message;
  for (const auto& kv : env) message.append(kv).push_back('\0');
  const std::vector<int> fds = {stdout_fd >= 0 ? stdout_fd : STDOUT_FILENO,
                                stderr_fd >= 0 ? stderr_fd : STDERR_FILENO};
  if (!send_with_fds(control_.get(), message, fds)) return std::nullopt;
  control_.reset();
  taken_ = true;
  std::optional<ChildProcess> taken;
  taken.emplace(std::move(*child_));
  child_.reset();
  return taken;
}

}  // namespace ddprun::agent
