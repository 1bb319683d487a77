// The Watchdog against the real clients: torch's FileTimerClient (torch 1.13 and 2.x, run as
// the worker process itself) and the standard-library heartbeat sender users are told to use.
#include <gtest/gtest.h>

#include "agent/hang/hang_test_util.hpp"
#include "agent/hang/watchdog.hpp"

#ifndef DDPRUN_TORCH1_PYTHON
#define DDPRUN_TORCH1_PYTHON "/usr/bin/python3"
#endif
#ifndef DDPRUN_TORCH2_PYTHON
#define DDPRUN_TORCH2_PYTHON ""
#endif

namespace ddprun::agent::test {
namespace {

// A released scope, then one that is still open at its expiration.
constexpr const char* kTorchWorker = R"(
import sys, time
from torch.distributed.elastic.timer import FileTimerClient, configure, expires
configure(FileTimerClient(sys.argv[1]))
with expires(after=5, scope="quick"):
    pass
with expires(after=0.3, scope="stuck"):
    time.sleep(30)
)";

// What a user's training loop does: a non-blocking datagram, nothing else.
constexpr const char* kPythonBeats = R"(
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.setblocking(False)
for _ in range(25):
    try:
        s.sendto(b"", sys.argv[1])
    except (BlockingIOError, FileNotFoundError, ConnectionRefusedError):
        pass
    time.sleep(0.02)
time.sleep(30)
)";

bool runnable(const std::string& python) {
  return !python.empty() && ::access(python.c_str(), X_OK) == 0;
}

class TorchClientsTest : public HangTest {};

// Both torch generations at once, one worker each (their imports take seconds).
TEST_F(TorchClientsTest, TorchFileTimerClientExpires) {
  std::vector<std::string> pythons;
  for (std::string python : {DDPRUN_TORCH1_PYTHON, DDPRUN_TORCH2_PYTHON}) {
    if (runnable(python)) pythons.push_back(python);
  }
  if (pythons.empty()) GTEST_SKIP() << "no Python with torch";

  auto watchdog = make({});
  std::vector<Child> workers;
  std::vector<WatchedWorker> watched;
  for (size_t i = 0; i < pythons.size(); ++i) {
    workers.push_back(Child::exec({pythons[i], "-c", kTorchWorker, fifo_path_}));
    watched.push_back({.local_rank = static_cast<int>(i),
                       .global_rank = static_cast<int>(i),
                       .pid = workers.back().pid()});
  }
  watchdog->watch(watched);

  ASSERT_TRUE(wait_hangs(pythons.size(), 60s)) << "torch imports are slow, but not this slow ("
                                               << seen_.size() << " of " << pythons.size() << ")";
  for (const auto& seen : seen_) {
    const std::string& python = pythons[seen.hang.local_rank];
    EXPECT_EQ(seen.hang.kind, Hang::Kind::kTimerExpired) << python;
    EXPECT_EQ(seen.hang.scope, "stuck") << python;
    EXPECT_EQ(seen.hang.signal, SIGKILL) << python;
    EXPECT_EQ(seen.hang.pid, watched[seen.hang.local_rank].pid) << python;
    EXPECT_LT(seen.hang.silent_for, 100ms) << python;
  }
  EXPECT_EQ(watchdog->timer_requests(), 3 * pythons.size());
  EXPECT_EQ(watchdog->bad_requests(), 0u);
}

TEST_F(TorchClientsTest, PythonHeartbeatSender) {
  if (!runnable("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  auto watchdog = make({.hang_timeout = 200ms, .first_beat_timeout = 5s});
  Child worker = Child::exec({"/usr/bin/python3", "-c", kPythonBeats, hb_path_});
  const auto start = Clock::now();
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = worker.pid()}});

  ASSERT_TRUE(wait_hangs(1, 10s));
  EXPECT_EQ(seen_[0].hang.kind, Hang::Kind::kNoHeartbeat);
  // The 25th and last beat goes out 24 sleeps of 20 ms after the first (which comes after
  // Python's start-up, itself after `start`); the hang is due hang_timeout later.
  EXPECT_GE(ms_between(start, seen_[0].at), 24 * 20 + 200);
  EXPECT_GE(watchdog->beats_received(), 20u);
}

}  // namespace
}  // namespace ddprun::agent::test
