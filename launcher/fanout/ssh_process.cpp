#include "launcher/fanout/ssh_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <system_error>

extern char** environ;

namespace ddprun::launcher {
namespace {

namespace asio = boost::asio;

// agent::SpawnRequest has no stdin: the child inherits ours. For the moment of the fork, our
// fd 0 is the pipe's read end, then ours again. The launching ddprun is single-threaded and
// never reads its stdin, so nobody sees the swap.
class StdinSwap {
 public:
  explicit StdinSwap(int fd) {
    if (fd < 0) return;
    saved_ = sys::UniqueFd(::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3));
    if (!saved_ || ::dup2(fd, STDIN_FILENO) < 0) {
      throw std::system_error(errno, std::generic_category(), "stdin for ssh");
    }
  }
  ~StdinSwap() {
    if (saved_) ::dup2(saved_.get(), STDIN_FILENO);
  }
  StdinSwap(const StdinSwap&) = delete;
  StdinSwap& operator=(const StdinSwap&) = delete;

 private:
  sys::UniqueFd saved_;
};

std::shared_ptr<agent::StreamPump> pump(asio::io_context& io, sys::UniqueFd read_end, int console,
                                        const std::string& prefix) {
  agent::PumpSinks sinks;
  sinks.console_fd = console;
  sinks.prefix = prefix;
  return std::make_shared<agent::StreamPump>(io, std::move(read_end), std::move(sinks));
}

agent::ChildProcess start(const std::vector<std::string>& argv, int in, int out, int err) {
  std::vector<std::string> strings = argv;
  std::vector<char*> cargv;
  for (auto& s : strings) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  agent::SpawnRequest req;
  req.path = strings[0].c_str();
  req.argv = cargv.data();
  req.envp = environ;
  req.stdout_fd = out;
  req.stderr_fd = err;
  req.reset_signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};
  StdinSwap swap(in);
  return agent::ChildProcess::spawn(req);
}

}  // namespace

SshProcess::SshProcess(asio::io_context& io, const std::vector<std::string>& argv,
                       const SshStreams& streams, OnExit on_exit)
    : child_([&] {
        sys::Pipe in, out, err;
        if (streams.stdin_pipe) in = sys::make_pipe();
        int out_fd = streams.stdout_fd, err_fd = streams.stderr_fd;
        if (!streams.line_prefix.empty()) {
          out = sys::make_pipe();
          err = sys::make_pipe();
          out_fd = out.write.get();
          err_fd = err.write.get();
        }
        agent::ChildProcess child = start(argv, in.read.get(), out_fd, err_fd);
        stdin_ = std::move(in.write);
        if (!streams.line_prefix.empty()) {
          out_ = pump(io, std::move(out.read), STDOUT_FILENO, streams.line_prefix);
          err_ = pump(io, std::move(err.read), STDERR_FILENO, streams.line_prefix);
        }
        return child;
      }()),
      pidfd_(io, child_.take_pidfd().release()),
      on_exit_(std::move(on_exit)) {
  if (out_) out_->start();
  if (err_) err_->start();
  watch_exit();
}

void SshProcess::watch_exit() {
  pidfd_.async_wait(asio::posix::stream_descriptor::wait_read,
                    [this](boost::system::error_code ec) {
                      if (ec) return;
                      // A readiness of another descriptor's (ChildProcess::has_exited).
                      if (!agent::ChildProcess::has_exited(pidfd_.native_handle())) {
                        watch_exit();
                        return;
                      }
                      on_exited();
                    });
}

SshProcess::~SshProcess() {
  boost::system::error_code ignored;
  pidfd_.cancel(ignored);
}

void SshProcess::on_exited() {
  agent::ExitStatus status = child_.reap();
  if (out_) out_->finish();
  if (err_) err_->finish();
  stdin_.reset();
  if (on_exit_) on_exit_(status);
}

}  // namespace ddprun::launcher
