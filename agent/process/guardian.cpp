#include "agent/process/guardian.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "store/sys/fd.hpp"
#include "store/sys/log.hpp"

namespace ddprun::agent {
namespace {

constexpr int32_t kRemoveRecord = INT32_MIN;  // no process group id is that

// The guardian's whole life. Single-threaded copy of ddprun taken before any thread existed,
// so ordinary library calls are fine here.
[[noreturn]] void guardian_main(int read_fd, Guardian::ExitAction action) {
  ::setsid();
  ::prctl(PR_SET_NAME, "ddprun-guard");
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP && sig != SIGCHLD) ::signal(sig, SIG_IGN);
  }
  int devnull = ::open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
  }
  // Keep only the pipe: a guardian holding ddprun's stdout open would delay EOF for readers.
  if (read_fd != 3) ::dup2(read_fd, 3);
  ::syscall(SYS_close_range, 4, ~0U, 0);

  // Records: int32 > 0 watches a process group, < 0 unwatches it; 0 and kRemoveRecord are
  // followed by an int32 length and that many bytes: the exit request, the directory to remove.
  std::vector<pid_t> groups;
  std::string exit_request;
  std::string remove_dir;
  std::string in;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(3, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: ddprun is gone
    in.append(buf, static_cast<size_t>(n));
    size_t at = 0;
    for (;;) {
      int32_t r;
      if (in.size() - at < sizeof r) break;
      std::memcpy(&r, in.data() + at, sizeof r);
      if (r == 0 || r == kRemoveRecord) {
        int32_t len;
        if (in.size() - at < 2 * sizeof r) break;
        std::memcpy(&len, in.data() + at + sizeof r, sizeof len);
        if (len < 0 || in.size() - at - 2 * sizeof r < static_cast<size_t>(len)) break;
        (r == 0 ? exit_request : remove_dir)
            .assign(in, at + 2 * sizeof r, static_cast<size_t>(len));
        at += 2 * sizeof r + static_cast<size_t>(len);
        continue;
      }
      if (r > 0) {
        groups.push_back(r);
      } else {
        std::erase(groups, -r);
      }
      at += sizeof r;
    }
    in.erase(0, at);
  }
  // The exit request first (within 1 s): the other nodes then learn of this node's end
  // (its etcd lease revoked) before its workers' sockets close under their collectives,
  // which would count as a worker failure and spend a restart.
  if (action && !exit_request.empty()) action(exit_request, std::chrono::seconds(1));
  for (pid_t g : groups) ::kill(-g, SIGKILL);
  if (!remove_dir.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(remove_dir, ignored);
  }
  ::_exit(0);
}

}  // namespace

std::unique_ptr<Guardian> Guardian::start(ExitAction action) {
  sys::Pipe p = sys::make_pipe();
  pid_t pid = ::fork();
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork (guardian)");
  if (pid == 0) {
    p.write.reset();
    guardian_main(p.read.get(), action);
  }
  p.read.reset();
  return std::unique_ptr<Guardian>(new Guardian(pid, std::move(p.write)));
}

Guardian::~Guardian() {
  pipe_.reset();
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

void Guardian::send(int32_t record) {
  send_bytes(reinterpret_cast<const char*>(&record), sizeof record);
}

void Guardian::send_bytes(const char* data, size_t size) {
  if (!pipe_) return;
  bool ok = true;
  while (size > 0) {
    ssize_t n = ::write(pipe_.get(), data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      break;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  if (!ok && !warned_) {
    warned_ = true;
    sys::log_line(
        "warning: the orphan guardian is gone; workers' children may outlive ddprun if it "
        "is killed");
  }
}

void Guardian::watch(pid_t pgid) {
  send(static_cast<int32_t>(pgid));
}
void Guardian::unwatch(pid_t pgid) {
  send(-static_cast<int32_t>(pgid));
}

void Guardian::set_exit_request(const std::string& request) {
  send_text(0, request);
}

void Guardian::remove_at_exit(const std::string& directory) {
  send_text(kRemoveRecord, directory);
}

void Guardian::send_text(int32_t kind, const std::string& text) {
  std::string record(2 * sizeof(int32_t), '\0');
  const int32_t len = static_cast<int32_t>(text.size());
  std::memcpy(record.data(), &kind, sizeof kind);
  std::memcpy(record.data() + sizeof(int32_t), &len, sizeof len);
  record += text;
  send_bytes(record.data(), record.size());
}

}  // namespace ddprun::agent
