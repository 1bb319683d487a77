// Test helpers for hang_test: a private directory, forked "workers" (each the leader of its own
// process group, as the agent starts them), the client side of both protocols, and running the
// io_context until something happened.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/hang/watchdog.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent::test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// mkdtemp under /tmp (short: socket paths must fit in 108 bytes); removed with its contents.
class TestDir {
 public:
  TestDir() {
    char templ[] = "/tmp/ddprun_hang_XXXXXX";
    if (::mkdtemp(templ) != nullptr) path_ = templ;
  }
  ~TestDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A forked process leading its own process group. On destruction the whole group is killed
// with SIGKILL and the child reaped.
class Child {
 public:
  // Runs `body` in the child, then _exit(0).
  static Child fork_and_run(const std::function<void()>& body) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      body();
      ::_exit(0);
    }
    if (pid > 0) ::setpgid(pid, pid);  // either side may win the race; both agree
    return Child(pid);
  }
  // execv's argv[0] in the child.
  static Child exec(std::vector<std::string> argv) {
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    return fork_and_run([&] {
      ::execv(args[0], args.data());
      ::_exit(127);
    });
  }

  Child(Child&& other) noexcept : pid_(std::exchange(other.pid_, -1)) {}
  Child& operator=(Child&&) = delete;
  ~Child() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  explicit Child(pid_t pid) : pid_(pid) {}
  pid_t pid_;
};

// One datagram to the heartbeat socket, without blocking, as a worker sends it.
inline bool send_beat(const std::string& path, const std::string& payload = {}) {
  sys::UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  return ::sendto(fd.get(), payload.data(), payload.size(), 0,
                  reinterpret_cast<const sockaddr*>(&addr),
                  sizeof addr) == static_cast<ssize_t>(payload.size());
}

// Beats `count` times, `interval` apart (in a forked child: sleeping is what a worker does).
inline void beat_for(const std::string& path, int count, std::chrono::milliseconds interval) {
  for (int i = 0; i < count; ++i) {
    send_beat(path);
    std::this_thread::sleep_for(interval);
  }
}

// Writes bytes to the FIFO as FileTimerClient does (O_WRONLY|O_NONBLOCK, write, close).
inline bool write_fifo(const std::string& path, const std::string& bytes) {
  sys::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  return fd && sys::write_all(fd.get(), bytes.data(), bytes.size());
}

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A request line in torch's format; expires_in < 0 makes it a release.
inline std::string timer_line(pid_t pid, const std::string& scope, double expires_in,
                              int signal = SIGKILL) {
  const double expiration = expires_in < 0 ? -1 : wall_seconds() + expires_in;
  return "{\"version\": 1, \"pid\": " + std::to_string(pid) + ", \"scope_id\": \"" + scope +
         "\", \"expiration_time\": " + std::to_string(expiration) +
         ", \"signal\": " + std::to_string(signal) + "}\n";
}

// Runs `io` until `done()` holds or `timeout` passed; returns done().
template <class Done>
bool run_until(boost::asio::io_context& io, Done done, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  io.restart();
  while (!done() && Clock::now() < deadline) io.run_one_until(deadline);
  return done();
}

inline void run_for(boost::asio::io_context& io, std::chrono::milliseconds d) {
  run_until(
      io, [] { return false; }, d);
}

inline long long ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

// A Watchdog over a private directory; every reported hang is kept with the time it arrived.
class HangTest : public ::testing::Test {
 protected:
  struct Seen {
    Hang hang;
    Clock::time_point at;
  };

  std::unique_ptr<Watchdog> make(HangOptions options, bool with_fifo = true) {
    return std::make_unique<Watchdog>(io_, options, hb_path_, with_fifo ? fifo_path_ : "",
                                      [this](const Hang& h) {
                                        seen_.push_back({h, Clock::now()});
                                      });
  }
  // Runs the io_context until `n` hangs were reported (false if not within `timeout`).
  bool wait_hangs(size_t n, std::chrono::milliseconds timeout = 5s) {
    return run_until(
        io_, [&] { return seen_.size() >= n; }, timeout);
  }

  TestDir dir_;
  std::string hb_path_ = dir_.file("hb.sock");
  std::string fifo_path_ = dir_.file("timer.fifo");
  boost::asio::io_context io_;
  std::vector<Seen> seen_;
};

}  // namespace ddprun::agent::test
