// The heartbeat half of the Watchdog, with real processes: forked workers (each leading its own
// process group) and this test process where that is simpler. Also the socket's file, and
// destruction while operations are pending.
#include "agent/hang/watchdog.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <boost/asio/steady_timer.hpp>

#include "agent/hang/hang_test_util.hpp"

namespace ddprun::agent::test {
namespace {

namespace asio = boost::asio;

class HeartbeatTest : public HangTest {};

TEST_F(HeartbeatTest, BeatsKeepAWorkerAlivePastTheTimeoutAndSilenceIsReported) {
  auto watchdog = make({.hang_timeout = 200ms});
  watchdog->watch({{.local_rank = 0, .global_rank = 4, .pid = ::getpid()}});

  // 12 beats 50 ms apart from this very process: 0.6 s, three times the timeout.
  asio::steady_timer beat_timer(io_);
  int sent = 0;
  Clock::time_point last_sent;
  std::function<void()> beat = [&] {
    ASSERT_TRUE(send_beat(hb_path_));
    last_sent = Clock::now();
    if (++sent == 12) return;
    beat_timer.expires_after(50ms);
    beat_timer.async_wait([&](boost::system::error_code) { beat(); });
  };
  beat();

  ASSERT_TRUE(wait_hangs(1));
  EXPECT_EQ(sent, 12) << "reported hung while it was beating";
  const Hang& hang = seen_[0].hang;
  EXPECT_EQ(hang.kind, Hang::Kind::kNoHeartbeat);
  EXPECT_EQ(hang.global_rank, 4);
  EXPECT_EQ(hang.pid, ::getpid());
  EXPECT_GE(hang.silent_for, 200ms);
  EXPECT_GE(ms_between(last_sent, seen_[0].at), 200);
  EXPECT_LE(ms_between(last_sent, seen_[0].at), 300);
  EXPECT_EQ(hang.describe(), "no heartbeat for 0.2 s");
  EXPECT_EQ(watchdog->beats_received(), 12u);
}

TEST_F(HeartbeatTest, AChildThatFallsSilentIsReportedOnce) {
  auto watchdog = make({.hang_timeout = 200ms});
  Child worker = Child::fork_and_run([&] {
    beat_for(hb_path_, 5, 20ms);
    ::sleep(30);
  });
  watchdog->watch({{.local_rank = 3, .global_rank = 11, .pid = worker.pid()}});

  ASSERT_TRUE(wait_hangs(1));
  const Hang& hang = seen_[0].hang;
  EXPECT_EQ(hang.kind, Hang::Kind::kNoHeartbeat);
  EXPECT_EQ(hang.local_rank, 3);
  EXPECT_EQ(hang.global_rank, 11);
  EXPECT_EQ(hang.pid, worker.pid());
  EXPECT_EQ(hang.worker_pid, worker.pid());
  auto last = watchdog->last_beat(3);
  ASSERT_TRUE(last.has_value());
  EXPECT_GE(ms_between(*last, seen_[0].at), 200);
  EXPECT_LE(ms_between(*last, seen_[0].at), 300);
  EXPECT_EQ(watchdog->beats_received(), 5u);

  run_for(io_, 500ms);
  EXPECT_EQ(seen_.size(), 1u) << "a hung worker is reported once";
}

TEST_F(HeartbeatTest, NoFirstBeatWithinTheDeadline) {
  auto watchdog = make({.hang_timeout = 100ms, .first_beat_timeout = 200ms});
  Child worker = Child::fork_and_run([] { ::sleep(30); });
  const auto start = Clock::now();
  watchdog->watch({{.local_rank = 1, .global_rank = 1, .pid = worker.pid()}});

  ASSERT_TRUE(wait_hangs(1));
  EXPECT_EQ(seen_[0].hang.kind, Hang::Kind::kNoFirstHeartbeat);
  EXPECT_GE(ms_between(start, seen_[0].at), 200);
  EXPECT_LE(ms_between(start, seen_[0].at), 300);
  EXPECT_EQ(seen_[0].hang.describe(), "no first heartbeat within 0.2 s of start");
  EXPECT_FALSE(watchdog->last_beat(1).has_value());
}

TEST_F(HeartbeatTest, TheFirstBeatBringsTheShorterHangTimeoutIntoForce) {
  auto watchdog = make({.hang_timeout = 200ms, .first_beat_timeout = 10s});
  Child worker = Child::fork_and_run([&] {
    send_beat(hb_path_);
    ::sleep(30);
  });
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = worker.pid()}});

  ASSERT_TRUE(wait_hangs(1, 2s)) << "waited for the 10 s first-beat deadline instead";
  EXPECT_EQ(seen_[0].hang.kind, Hang::Kind::kNoHeartbeat);
}

TEST_F(HeartbeatTest, AGrandchildInTheWorkersProcessGroupBeatsForIt) {
  auto watchdog = make({.hang_timeout = 200ms, .first_beat_timeout = 200ms});
  // The worker itself never beats; its data loader (a child, same process group) does, 0.6 s.
  Child worker = Child::fork_and_run([&] {
    if (::fork() == 0) {
      beat_for(hb_path_, 12, 50ms);
      ::_exit(0);
    }
    ::sleep(30);
  });
  const auto start = Clock::now();
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = worker.pid()}});

  ASSERT_TRUE(wait_hangs(1));
  EXPECT_EQ(seen_[0].hang.kind, Hang::Kind::kNoHeartbeat);
  EXPECT_EQ(seen_[0].hang.pid, worker.pid());
  EXPECT_GE(ms_between(start, seen_[0].at), 600);
  EXPECT_GE(watchdog->beats_received(), 10u);
  EXPECT_EQ(watchdog->ignored(), 0u);
}

TEST_F(HeartbeatTest, BeatsFromOtherProcessesAreIgnored) {
  auto watchdog = make({.first_beat_timeout = 300ms});
  Child worker = Child::fork_and_run([] { ::sleep(30); });
  // Another process group altogether, beating all along.
  Child stranger = Child::fork_and_run([&] { beat_for(hb_path_, 100, 20ms); });
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = worker.pid()}});

  ASSERT_TRUE(wait_hangs(1));
  EXPECT_EQ(seen_[0].hang.kind, Hang::Kind::kNoFirstHeartbeat);
  EXPECT_EQ(watchdog->beats_received(), 0u);
  EXPECT_GT(watchdog->ignored(), 5u);
}

TEST_F(HeartbeatTest, ThePayloadIsIgnoredTheKernelSaysWhoSentIt) {
  auto watchdog = make({});
  Child other = Child::fork_and_run([] { ::sleep(30); });
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = ::getpid()},
                   {.local_rank = 1, .global_rank = 1, .pid = other.pid()}});
  // Claims to be the other worker, in a datagram bigger than what is read of it.
  ASSERT_TRUE(send_beat(hb_path_, std::to_string(other.pid()) + std::string(3000, ' ')));
  ASSERT_TRUE(run_until(
      io_, [&] { return watchdog->beats_received() == 1; }, 2s));
  EXPECT_TRUE(watchdog->last_beat(0).has_value());
  EXPECT_FALSE(watchdog->last_beat(1).has_value());
}

TEST_F(HeartbeatTest, ExitedWorkersAndUnwatchedGroupsAreNotJudged) {
  auto watchdog = make({.first_beat_timeout = 200ms});
  Child a = Child::fork_and_run([] { ::sleep(30); });
  Child b = Child::fork_and_run([] { ::sleep(30); });
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = a.pid()},
                   {.local_rank = 1, .global_rank = 1, .pid = b.pid()}});
  watchdog->worker_exited(0);
  ASSERT_TRUE(wait_hangs(1));
  EXPECT_EQ(seen_[0].hang.local_rank, 1);
  run_for(io_, 200ms);
  EXPECT_EQ(seen_.size(), 1u);

  // A new attempt; then the group stops: no verdicts, but beats are still recorded.
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = ::getpid()}});
  watchdog->unwatch();
  ASSERT_TRUE(send_beat(hb_path_));
  run_for(io_, 300ms);
  EXPECT_EQ(seen_.size(), 1u);
  EXPECT_TRUE(watchdog->last_beat(0).has_value());
}

TEST_F(HeartbeatTest, TheSocketFileIsPrivateAndRemoved) {
  {
    auto watchdog = make({}, false);
    struct stat st {};
    ASSERT_EQ(::lstat(hb_path_.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(watchdog->heartbeat_path(), hb_path_);
    EXPECT_EQ(watchdog->timer_fifo_path(), "");
    // A live socket is not taken over.
    EXPECT_THROW(make({}, false), std::system_error);
  }
  EXPECT_NE(::access(hb_path_.c_str(), F_OK), 0);
}

TEST_F(HeartbeatTest, AStaleSocketFileIsReplaced) {
  {
    // What a killed agent leaves: a bound socket file nobody reads.
    sys::UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, hb_path_.c_str());
    ASSERT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  }
  auto watchdog = make({});
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = ::getpid()}});
  ASSERT_TRUE(send_beat(hb_path_));
  EXPECT_TRUE(run_until(
      io_, [&] { return watchdog->beats_received() == 1; }, 2s));
}

TEST_F(HeartbeatTest, APathTooLongForASocketIsRefusedByName) {
  const std::string long_path = dir_.file(std::string(120, 'x'));
  try {
    Watchdog watchdog(io_, {}, long_path, "", nullptr);
    FAIL() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find(long_path), std::string::npos) << e.what();
  }
}

TEST_F(HeartbeatTest, DestructionWithCompletionsStillQueued) {
  auto watchdog = make({.hang_timeout = 1ms, .first_beat_timeout = 1ms});
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = ::getpid()}});
  // Deadlines pass and data arrives while the io_context does not run; then the Watchdog goes.
  ::usleep(20'000);
  send_beat(hb_path_);
  write_fifo(fifo_path_, timer_line(::getpid(), "s", 0));
  io_.restart();
  io_.poll_one();  // some completions are now queued, not yet run
  watchdog.reset();
  run_for(io_, 100ms);
  EXPECT_TRUE(seen_.empty());
  EXPECT_NE(::access(hb_path_.c_str(), F_OK), 0);
  EXPECT_NE(::access(fifo_path_.c_str(), F_OK), 0);
}

TEST_F(HeartbeatTest, TheCallbackMayDestroyTheWatchdog) {
  Child a = Child::fork_and_run([] { ::sleep(30); });
  Child b = Child::fork_and_run([] { ::sleep(30); });
  std::unique_ptr<Watchdog> watchdog;
  int calls = 0;
  watchdog = std::make_unique<Watchdog>(io_, HangOptions{.first_beat_timeout = 100ms}, hb_path_,
                                        fifo_path_, [&](const Hang&) {
                                          ++calls;
                                          watchdog.reset();
                                        });
  // Both workers fall due together: the second report must not reach a dead Watchdog.
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = a.pid()},
                   {.local_rank = 1, .global_rank = 1, .pid = b.pid()}});
  ::usleep(150'000);
  run_for(io_, 150ms);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(watchdog, nullptr);
}

TEST_F(HeartbeatTest, TheCallbackMayStartANewAttempt) {
  Child a = Child::fork_and_run([] { ::sleep(30); });
  std::unique_ptr<Watchdog> watchdog;
  watchdog = std::make_unique<Watchdog>(
      io_, HangOptions{.first_beat_timeout = 100ms}, hb_path_, fifo_path_, [&](const Hang& h) {
        seen_.push_back({h, Clock::now()});
        if (seen_.size() == 1)
          watchdog->watch({{.local_rank = 5, .global_rank = 5, .pid = a.pid()}});
      });
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = a.pid()}});
  ASSERT_TRUE(wait_hangs(2));
  EXPECT_EQ(seen_[0].hang.local_rank, 0);
  EXPECT_EQ(seen_[1].hang.local_rank, 5);
}

}  // namespace
}  // namespace ddprun::agent::test
