#include "launcher/fanout/fanout_runner.hpp"

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <optional>

#include "launcher/entrypoint.hpp"
#include "launcher/exit_codes.hpp"
#include "launcher/fanout/fanout_result.hpp"
#include "launcher/fanout/reachability.hpp"
#include "launcher/fanout/ssh_process.hpp"
#include "store/sys/console.hpp"
#include "store/sys/log.hpp"
#include "store/sys/signal_names.hpp"

namespace ddprun::launcher {
namespace {

namespace asio = boost::asio;

constexpr std::chrono::seconds kStopMargin{10};  // beyond the nodes' own shutdown timeout

class FanoutJob {
 public:
  FanoutJob(const FanoutPlan& plan, std::string ssh_program)
      : plan_(plan),
        ssh_program_(std::move(ssh_program)),
        signals_(io_, SIGINT, SIGTERM, SIGHUP),
        kill_timer_(io_) {}

  int run() {
    signals_.add(SIGQUIT);
    arm_signals();
    sys::Console::attach(io_);  // the nodes' lines never block this loop (console.hpp)
    std::string line = "starting " + std::to_string(plan_.nodes.size()) + " node(s) over ssh:";
    for (const auto& n : plan_.nodes) line += " " + n.host;
    sys::log_line(line);
    for (size_t i = 0; i < plan_.nodes.size(); ++i) {
      std::vector<std::string> argv = plan_.nodes[i].ssh_argv;
      argv[0] = ssh_program_;
      SshStreams streams;
      streams.stdin_pipe = true;
      streams.line_prefix = plan_.nodes[i].host + ": ";
      stopped_.push_back(false);
      procs_.push_back(std::make_unique<SshProcess>(
          io_, argv, streams, [this, i](agent::ExitStatus st) { on_exit(i, st); }));
      ++running_;
    }
    io_.run();
    const FanoutResult result = fanout_result(ends_, signal_);
    if (!result.line.empty()) {
      sys::log_line(result.line + ", exiting with " + std::to_string(result.code));
    }
    sys::Console::finish(std::chrono::seconds(1));  // before io_ goes
    return result.code;
  }

 private:
  void arm_signals() {
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (signal_) {
        sys::log_line("received " + sys::signal_name(sig) + " again: killing the ssh clients");
        for (auto& p : procs_) p->kill();
      } else {
        signal_ = sig;
        stop_all("received " + sys::signal_name(sig));
      }
      arm_signals();
    });
  }

  void on_exit(size_t i, agent::ExitStatus st) {
    ends_.push_back({plan_.nodes[i].host, plan_.nodes[i].node_rank, st, stopped_[i]});
    --running_;
    if (!st.success() && !stopping_) {
      stop_all("node " + std::to_string(i) + " (" + plan_.nodes[i].host + ") " + st.describe());
    }
    if (running_ == 0) {
      signals_.cancel();
      kill_timer_.cancel();
    }
  }

  // Tells every running node to stop (EOF on its stdin), SIGKILL for the ssh of those that
  // are still there after their own shutdown timeout and a margin.
  void stop_all(const std::string& why) {
    stopping_ = true;
    size_t told = 0;
    for (size_t i = 0; i < procs_.size(); ++i) {
      if (!procs_[i]->running()) continue;
      stopped_[i] = true;
      procs_[i]->close_stdin();
      ++told;
    }
    if (told == 0) return;
    sys::log_line(why + ": stopping " + std::to_string(told) + " node(s)");
    kill_timer_.expires_after(plan_.shutdown_timeout + plan_.close_timeout + kStopMargin);
    kill_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      sys::log_line("nodes still running after being told to stop: killing their ssh clients");
      for (auto& p : procs_) p->kill();
    });
  }

  const FanoutPlan& plan_;
  std::string ssh_program_;
  asio::io_context io_{1};
  asio::signal_set signals_;
  asio::steady_timer kill_timer_;
  std::vector<std::unique_ptr<SshProcess>> procs_;
  std::vector<bool> stopped_;  // by node: told to stop before it ended
  std::vector<NodeEnd> ends_;  // in the order the nodes ended
  size_t running_ = 0;
  bool stopping_ = false;
  std::optional<int> signal_;
};

}  // namespace

int run_fanout(const FanoutPlan& plan, const GetEnv& getenv) {
  for (const auto& notice : plan.notices) sys::log_line(notice);
  const std::string& ssh = plan.nodes.front().ssh_argv.front();
  const std::string ssh_program = find_executable(ssh, getenv);
  if (ssh_program.empty()) {
    sys::log_line("error: " + ssh + " (--ssh-command) is not an executable program here");
    return kExitFailure;
  }
  auto unreachable = probe_hosts(plan, ssh_program);
  if (!unreachable.empty()) {
    sys::log_line("error: " + unreachable_line(unreachable, plan.nodes.size()));
    return kExitFailure;
  }
  FanoutJob job(plan, ssh_program);
  return job.run();
}

}  // namespace ddprun::launcher
