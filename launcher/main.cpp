// ddprun: the launcher and the agent in one process, like torchrun.
//
// Order matters: parse and validate everything first (bad input exits 2 having started
// nothing), then start the orphan guardian, then hand the job to the agent.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstdlib>

#include "agent/agent.hpp"
#include "agent/etcd/lease_revoke.hpp"
#include "agent/process/guardian.hpp"
#include "agent/process/orphan_sweep.hpp"
#include "agent/rendezvous/make_rendezvous.hpp"
#include "launcher/cli_parser.hpp"
#include "launcher/exit_codes.hpp"
#include "launcher/fanout/fanout_runner.hpp"
#include "launcher/fanout/stdin_eof_watch.hpp"
#include "launcher/launch_plan.hpp"
#include "launcher/usage.hpp"
#include "store/sys/console.hpp"
#include "store/sys/fd.hpp"
#include "store/sys/fd_limit.hpp"
#include "store/sys/log.hpp"

extern char** environ;

namespace {

using namespace ddprun;

constexpr std::chrono::milliseconds kConsoleDrainAtExit{1000};

// A closed stdin/stdout/stderr would make the next pipe or file take its number.
void ensure_standard_fds() {
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0) {
      int null_fd = ::open("/dev/null", O_RDWR);
      if (null_fd >= 0 && null_fd != fd) {
        ::dup2(null_fd, fd);
        ::close(null_fd);
      }
    }
  }
}

void print(int fd, const std::string& text) {
  sys::write_all(fd, text.data(), text.size());
}

std::optional<std::string> get_env(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

// What the command line asks for: a job to run here, a fan-out to other hosts, or an exit
// code (help, version, completion, or a usage error, all printed).
struct Request {
  std::optional<int> exit_now;
  launcher::LaunchPlan plan;
  std::optional<launcher::FanoutPlan> fanout;  // --hosts/--hostfile: this ddprun only launches
  bool stop_on_stdin_eof = false;
};

Request read_command_line(const std::vector<std::string>& args) {
  Request r;
  try {
    launcher::LaunchConfig config = launcher::parse_command_line(args, get_env);
    if (config.help || config.version || !config.print_completion.empty()) {
      print(STDOUT_FILENO, config.help      ? launcher::help_text()
                           : config.version ? launcher::version_text()
                                            : launcher::completion_script(config.print_completion));
      r.exit_now = launcher::kExitSuccess;
      return r;
    }
    r.stop_on_stdin_eof = config.fanout.stop_on_stdin_eof;
    if (config.fanout.active()) {
      r.fanout = launcher::make_fanout_plan(config, launcher::this_process_inputs(get_env));
      r.fanout->notices.insert(r.fanout->notices.begin(), config.notices.begin(),
                               config.notices.end());
    } else {
      std::vector<std::string> env;
      for (char** e = environ; *e; ++e) env.emplace_back(*e);
      r.plan = launcher::make_launch_plan(config, get_env, std::move(env));
    }
  } catch (const launcher::CliError& e) {
    print(STDERR_FILENO, launcher::usage_line() + "ddprun: error: " + e.what() + "\n");
    r.exit_now = launcher::kExitUsage;
  }
  return r;
}

// The agent on this node, from the orphan guardian's start to the job's last line.
int run_agent(launcher::LaunchPlan plan, bool stop_on_stdin_eof) {
  // Before the guardian, which watches its replacement through it: destroyed after it.
  boost::asio::io_context io(1);
  std::unique_ptr<agent::Guardian> guardian;
  try {
    guardian = agent::Guardian::start();
  } catch (const std::exception& e) {
    sys::log_line(std::string("warning: no orphan guardian: ") + e.what());
  }
  // What a worker starts outside its process group becomes ddprun's when its parent dies, to
  // be swept at the attempt's end (agent/process/orphan_sweep.hpp).
  if (!agent::become_subreaper()) sys::log_line("warning: cannot become a child subreaper");
  if (guardian) guardian->keep(io);
  // From here on a console nobody reads cannot stop the agent (store/sys/console.hpp).
  sys::Console::attach(io);
  std::optional<launcher::StdinEofWatch> stdin_watch;  // EOF: SIGTERM, the agent's usual path
  if (stop_on_stdin_eof) stdin_watch.emplace(io);
  agent::LeaseObserver lease_observer;  // etcd: the guardian revokes the lease if we die
  if (guardian) {
    lease_observer = [g = guardian.get()](const std::string& request) {
      g->set_exit_request(request);
    };
  }
  std::unique_ptr<agent::RendezvousHandler> rendezvous =
      agent::make_rendezvous(io, plan.multi_node, plan.rendezvous, std::move(lease_observer));
  agent::Agent job(io, std::move(plan.spec), std::move(rendezvous), guardian.get());
  const agent::JobResult result = job.run();
  const int code = launcher::exit_code(result);
  // The job's last line: why it ended, and the exit code that says so.
  if (code != launcher::kExitSuccess) {
    sys::log_line(result.what + ", exiting with " + std::to_string(code));
  } else if (!result.what.empty()) {
    sys::log_line(result.what);
  }
  // A slow console gets a moment to show the last lines; a stuck one does not hold the exit.
  sys::Console::finish(kConsoleDrainAtExit);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // The orphan guardian is this binary too (agent/process/guardian.hpp).
  agent::Guardian::run_if_guardian(&etcd::revoke_now);
  ensure_standard_fds();
  // A parent that started ddprun with signals blocked (SIGTERM, say) would leave it deaf to
  // them, and its workers too (they inherit the mask): ddprun and its workers start with none
  // blocked.
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Node rank 0's agent hosts the workers' store: one descriptor per worker of the job.
  // Workers get the limit they would have had (child_process.cpp).
  sys::raise_fd_limit();
  Request request = read_command_line(std::vector<std::string>(argv + 1, argv + argc));
  if (request.exit_now) return *request.exit_now;
  for (const auto& notice : request.plan.notices) sys::log_line(notice);
  // Console output to a closed pipe must not kill the agent (and with it the workers).
  ::signal(SIGPIPE, SIG_IGN);
  if (request.fanout) return launcher::run_fanout(*request.fanout, get_env);
  return run_agent(std::move(request.plan), request.stop_on_stdin_eof);
}
