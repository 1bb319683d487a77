#include "agent/process/zygote.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <system_error>

#include "agent/process/fd_passing.hpp"

namespace ddprun::agent {

// The zygote's program (zygote_boot.py), embedded by the build (zygote_boot.cpp).
extern const char kZygoteBoot[];

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// What `python -c` runs: reads the zygote's program from the control socket (descriptor 4)
// and runs it under a file name of its own, so its frames can be told from a script's.
constexpr const char* kLoader =
    "import socket,sys;s=socket.socket(fileno=4);src=s.recv(1<<22);s.detach();"
    "exec(compile(src,'<ddprun-zygote>','exec'))";

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ",") + i;
  return out;
}

}  // namespace

Zygote::Zygote(ZygoteOptions options) : options_(std::move(options)) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    throw std::system_error(errno, std::generic_category(), "socketpair");
  }
  control_.reset(pair[0]);
  sys::UniqueFd theirs(pair[1]);
  sys::UniqueFd log = sys::open_for_write(options_.log_path.c_str());
  // The last argument is room in the argv area for a worker's command line (zygote_boot.py).
  std::vector<std::string> argv = {options_.argv0.empty() ? options_.python : options_.argv0,
                                   "-u",
                                   "-c",
                                   kLoader,
                                   "4",
                                   std::to_string(::getpid()),
                                   joined(options_.modules),
                                   std::string(options_.cmdline_room, ' ')};
  auto cargv = c_array(argv);
  auto cenv = c_array(options_.env);
  SpawnRequest req;
  req.path = options_.python.c_str();
  req.argv = cargv.data();
  req.envp = cenv.data();
  req.stdout_fd = log.get();
  req.stderr_fd = log.get();
  req.reset_signals = options_.reset_signals;
  req.pass_fd = theirs.get();
  child_.emplace(ChildProcess::spawn(req));
  if (options_.guardian) options_.guardian->watch(child_->pid());
  send(kZygoteBoot, {});
}

Zygote::~Zygote() {
  control_.reset();  // the zygote's loop ends; its workers, if any, die with it
  if (child_ && !child_->reaped()) {
    child_->signal_group(SIGKILL);
    child_->reap();
  }
  if (child_ && options_.guardian) options_.guardian->unwatch(child_->pid());
}

void Zygote::fail(const std::string& why) {
  if (failure_.empty()) failure_ = why;
}

void Zygote::send(const std::string& text, const std::vector<int>& fds) {
  if (failed()) throw ZygoteError(failure_);
  if (!send_with_fds(control_.get(), text, fds)) {
    fail(std::string("the zygote is gone (") + std::strerror(errno) + ")");
    throw ZygoteError(failure_);
  }
}

std::optional<Zygote::Message> Zygote::receive(std::chrono::milliseconds timeout) {
  if (failed()) return std::nullopt;
  pollfd p{control_.get(), POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (r < 0 && errno == EINTR);
  if (r == 0) return std::nullopt;
  std::vector<char> data(1 << 20);
  iovec iov{data.data(), data.size()};
  char control[CMSG_SPACE(sizeof(int) * 4)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(control_.get(), &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {
    fail(n == 0 ? "the zygote exited (see its log, " + options_.log_path + ")"
                : std::string("the zygote's socket failed: ") + std::strerror(errno));
    return std::nullopt;
  }
  Message m;
  m.json.assign(data.data(), static_cast<size_t>(n));
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      m.fds.emplace_back(fd);
    }
  }
  return m;
}

std::optional<Zygote::Message> Zygote::file(Message m) {
  json j;
  try {
    j = json::parse(m.json);
  } catch (const json::exception& e) {
    fail(std::string("the zygote sent a malformed message: ") + e.what());
    return std::nullopt;
  }
  if (j.contains("ready")) {
    const json& r = j["ready"];
    Ready ready;
    ready.import_s = r.value("import_s", 0.0);
    ready.modules = r.value("modules", std::vector<std::string>{});
    ready.missing = r.value("missing", std::vector<std::string>{});
    ready.threads = r.value("threads", 0);
    ready.rss_kb = r.value("rss_kb", int64_t{0});
    ready_ = std::move(ready);
    return std::nullopt;
  }
  if (j.contains("exited")) {
    const pid_t pid = j["exited"].get<pid_t>();
    exits_[pid] = {j.contains("code") ? ExitStatus::exited(j["code"].get<int>())
                                      : ExitStatus::signaled(j.value("signal", SIGKILL)),
                   j.value("maxrss", uint64_t{0})};
    return std::nullopt;
  }
  return m;  // spawned, or error: the caller's answer
}

const std::optional<Zygote::Ready>& Zygote::ready() {
  while (!ready_ && !failed()) {
    auto m = receive(std::chrono::milliseconds(0));
    if (!m) break;
    file(std::move(*m));
  }
  return ready_;
}

ChildProcess Zygote::spawn(const ZygoteSpawn& request, int stdout_fd, int stderr_fd) {
  if (!ready()) throw ZygoteError(failed() ? failure_ : "the zygote is still importing");
  json j = {{"spawn",
             {{"mode", request.module ? "module" : "script"},
              {"target", request.target},
              {"args", request.args},
              {"orig_argv", request.orig_argv},
              {"env", request.env},
              {"cwd", request.cwd}}}};
  send(j.dump(), {stdout_fd, stderr_fd});
  const auto deadline = Clock::now() + kAnswerTimeout;
  while (!failed()) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      fail("the zygote did not answer a fork request within " +
           std::to_string(kAnswerTimeout.count() / 1000) + " s");
      break;
    }
    auto m = receive(left);
    if (!m) continue;
    auto answer = file(std::move(*m));
    if (!answer) continue;
    json a = json::parse(answer->json);
    if (a.contains("spawned") && answer->fds.size() == 1) {
      return ChildProcess::adopt(a["spawned"].get<pid_t>(), std::move(answer->fds[0]), this);
    }
    fail("the zygote could not fork a worker: " + a.value("error", answer->json));
  }
  throw ZygoteError(failure_);
}

ExitStatus Zygote::reap(pid_t pid, uint64_t& peak_rss_kb) {
  const auto deadline = Clock::now() + kAnswerTimeout;
  while (!exits_.count(pid) && !failed() && Clock::now() < deadline) {
    auto m =
        receive(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    if (m) file(std::move(*m));
  }
  auto it = exits_.find(pid);
  if (it == exits_.end()) return ExitStatus::signaled(SIGKILL);  // its zygote went first
  ExitStatus status = it->second.first;
  peak_rss_kb = it->second.second;
  exits_.erase(it);
  return status;
}

}  // namespace ddprun::agent
