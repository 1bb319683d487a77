// The FileTimer half of the Watchdog: request lines written to its FIFO the way torch's
// FileTimerClient writes them, on behalf of forked workers. Also the request parser and the
// timer table on their own.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "agent/hang/file_timers.hpp"
#include "agent/hang/hang_test_util.hpp"
#include "agent/hang/timer_request.hpp"
#include "agent/hang/watchdog.hpp"

namespace ddprun::agent::test {
namespace {

class FileTimerTest : public HangTest {
 protected:
  Child sleeper() {
    return Child::fork_and_run([] { ::sleep(30); });
  }
};

TEST_F(FileTimerTest, AnAcquiredScopeThatIsNeverReleasedExpires) {
  auto watchdog = make({});
  Child worker = sleeper();
  watchdog->watch({{.local_rank = 2, .global_rank = 6, .pid = worker.pid()}});
  const auto sent = Clock::now();
  ASSERT_TRUE(write_fifo(fifo_path_, timer_line(worker.pid(), "load_batch", 0.3, SIGKILL)));

  ASSERT_TRUE(wait_hangs(1));
  const Hang& hang = seen_[0].hang;
  EXPECT_EQ(hang.kind, Hang::Kind::kTimerExpired);
  EXPECT_EQ(hang.scope, "load_batch");
  EXPECT_EQ(hang.signal, SIGKILL);
  EXPECT_EQ(hang.pid, worker.pid());
  EXPECT_EQ(hang.worker_pid, worker.pid());
  EXPECT_EQ(hang.local_rank, 2);
  EXPECT_EQ(hang.global_rank, 6);
  EXPECT_GE(ms_between(sent, seen_[0].at), 290);  // the line carries wall time to the ms
  EXPECT_LE(ms_between(sent, seen_[0].at), 400);
  EXPECT_EQ(hang.describe(), "timer scope 'load_batch' expired (signal SIGKILL)");
  EXPECT_EQ(watchdog->timer_requests(), 1u);
}

TEST_F(FileTimerTest, AReleasedScopeDoesNotExpire) {
  auto watchdog = make({});
  Child worker = sleeper();
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = worker.pid()}});
  ASSERT_TRUE(write_fifo(fifo_path_, timer_line(worker.pid(), "step", 0.2)));
  ASSERT_TRUE(write_fifo(fifo_path_, timer_line(worker.pid(), "step", -1, 0)));
  run_for(io_, 500ms);
  EXPECT_TRUE(seen_.empty());
  EXPECT_EQ(watchdog->timer_requests(), 2u);
}

TEST_F(FileTimerTest, MalformedLinesAreCountedAndLaterRequestsStillWork) {
  auto watchdog = make({});
  Child worker = sleeper();
  const std::string pid = std::to_string(worker.pid());
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = worker.pid()}});
  const std::vector<std::string> bad = {
      "not json\n",
      timer_line(worker.pid(), std::string(10 * 1024, 's'), 0.1),  // 10 KiB: too long
      "[1, 2, 3]\n",
      "{\"pid\": \"" + pid + "\", \"scope_id\": \"a\", \"expiration_time\": 1, \"signal\": 9}\n",
      "{\"pid\": " + pid + ", \"scope_id\": 7, \"expiration_time\": 1, \"signal\": 9}\n",
      "{\"pid\": " + pid + ", \"scope_id\": \"a\", \"expiration_time\": \"soon\", \"signal\": 9}\n",
      "{\"pid\": " + pid + ".5, \"scope_id\": \"a\", \"expiration_time\": 1, \"signal\": 9}\n",
      "{\"pid\": " + pid + ", \"scope_id\": \"a\", \"expiration_time\": 1}\n",
      "{\"pid\": -3, \"scope_id\": \"a\", \"expiration_time\": 1, \"signal\": 9}\n",
      std::string("\x01\xff\x00{}\n", 6),
  };
  for (const auto& line : bad) ASSERT_TRUE(write_fifo(fifo_path_, line));
  ASSERT_TRUE(write_fifo(fifo_path_, timer_line(worker.pid(), "good", 0.1)));

  ASSERT_TRUE(wait_hangs(1));
  EXPECT_EQ(seen_[0].hang.scope, "good");
  EXPECT_EQ(watchdog->bad_requests(), bad.size());
  EXPECT_EQ(watchdog->timer_requests(), 1u);
}

TEST_F(FileTimerTest, RequestsFromPidsOfNoWorkerAreIgnored) {
  auto watchdog = make({});
  Child worker = sleeper();
  Child stranger = sleeper();
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = worker.pid()}});
  ASSERT_TRUE(write_fifo(fifo_path_, timer_line(stranger.pid(), "x", 0.05)));
  ASSERT_TRUE(write_fifo(fifo_path_, timer_line(::getpid(), "y", 0.05)));
  run_for(io_, 300ms);
  EXPECT_TRUE(seen_.empty());
  EXPECT_EQ(watchdog->ignored(), 2u);
}

TEST_F(FileTimerTest, AChildOfTheWorkerMayAskForItself) {
  auto watchdog = make({});
  sys::Pipe go = sys::make_pipe();  // watch() makes the FIFO the request must go to
  Child worker = Child::fork_and_run([&] {
    if (::fork() == 0) {  // a data loader: same process group, its own pid in the request
      char byte;
      if (::read(go.read.get(), &byte, 1) == 1) {
        write_fifo(fifo_path_, timer_line(::getpid(), "loader", 0.1, SIGTERM));
      }
      ::sleep(30);
    }
    ::sleep(30);
  });
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = worker.pid()}});
  ASSERT_TRUE(sys::write_all(go.write.get(), "x", 1));
  ASSERT_TRUE(wait_hangs(1));
  const Hang& hang = seen_[0].hang;
  EXPECT_EQ(hang.worker_pid, worker.pid());
  EXPECT_NE(hang.pid, worker.pid());
  EXPECT_EQ(::getpgid(hang.pid), worker.pid());
  EXPECT_EQ(hang.describe(), "timer scope 'loader' expired in pid " + std::to_string(hang.pid) +
                                 " (signal SIGTERM)");
}

TEST_F(FileTimerTest, ASignalOfZeroIsStillReported) {
  auto watchdog = make({});
  Child worker = sleeper();
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = worker.pid()}});
  ASSERT_TRUE(write_fifo(fifo_path_, timer_line(worker.pid(), "quiet", 0.05, 0)));
  ASSERT_TRUE(wait_hangs(1));
  EXPECT_EQ(seen_[0].hang.signal, 0);
  EXPECT_EQ(seen_[0].hang.describe(), "timer scope 'quiet' expired (no signal requested)");
}

TEST_F(FileTimerTest, EarliestFirstAndOneReportPerWorker) {
  auto watchdog = make({});
  Child a = sleeper();
  Child b = sleeper();
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = a.pid()},
                   {.local_rank = 1, .global_rank = 1, .pid = b.pid()}});
  ASSERT_TRUE(write_fifo(fifo_path_, timer_line(a.pid(), "a1", 0.25)));
  ASSERT_TRUE(write_fifo(fifo_path_, timer_line(a.pid(), "a2", 0.3)));
  ASSERT_TRUE(write_fifo(fifo_path_, timer_line(b.pid(), "b1", 0.1)));  // later, due sooner
  ASSERT_TRUE(wait_hangs(2));
  EXPECT_EQ(seen_[0].hang.scope, "b1");
  EXPECT_EQ(seen_[1].hang.scope, "a1");
  run_for(io_, 300ms);
  EXPECT_EQ(seen_.size(), 2u) << "a2 belonged to a worker already reported";
}

TEST_F(FileTimerTest, EveryAttemptGetsANewFifo) {
  auto watchdog = make({});
  Child worker = sleeper();
  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = worker.pid()}});
  // Attempt 1 acquires a scope and leaves half a line behind.
  ASSERT_TRUE(write_fifo(fifo_path_, timer_line(worker.pid(), "old", 0.1)));
  ASSERT_TRUE(write_fifo(fifo_path_, "{\"pid\": 1, \"sco"));
  run_for(io_, 20ms);
  // Held open, the old FIFO keeps its inode number, so the new one cannot reuse it.
  sys::UniqueFd old_fifo(::open(fifo_path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  ASSERT_TRUE(old_fifo);
  struct stat old_st {};
  ASSERT_EQ(::fstat(old_fifo.get(), &old_st), 0);

  watchdog->watch({{.local_rank = 0, .global_rank = 0, .pid = worker.pid()}});
  struct stat st {};
  ASSERT_EQ(::lstat(fifo_path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_NE(st.st_ino, old_st.st_ino);
  ASSERT_TRUE(write_fifo(fifo_path_, timer_line(worker.pid(), "new", 0.2)));
  ASSERT_TRUE(wait_hangs(1));
  EXPECT_EQ(seen_[0].hang.scope, "new");
  EXPECT_EQ(watchdog->bad_requests(), 0u);
}

TEST_F(FileTimerTest, NobodyReadsOnceTheWatchdogIsGone) {
  make({}).reset();
  EXPECT_NE(::access(fifo_path_.c_str(), F_OK), 0);
  EXPECT_FALSE(write_fifo(fifo_path_, "{}\n"));
}

TEST(TimerRequest, ParsesWhatTorchWrites) {
  auto parsed = parse_timer_request(
      R"({"version": 1, "pid": 4121, "scope_id": "train.py#42", "expiration_time": 1718000000.25, "signal": 9})");
  ASSERT_TRUE(parsed.request) << parsed.error;
  EXPECT_EQ(parsed.request->pid, 4121);
  EXPECT_EQ(parsed.request->scope_id, "train.py#42");
  EXPECT_DOUBLE_EQ(parsed.request->expiration_time, 1718000000.25);
  EXPECT_EQ(parsed.request->signal, 9);
  EXPECT_FALSE(parsed.request->is_release());

  auto release = parse_timer_request(
      R"({"version": 1, "pid": 4121, "scope_id": "s", "expiration_time": -1, "signal": 0})");
  ASSERT_TRUE(release.request);
  EXPECT_TRUE(release.request->is_release());
}

TEST(TimerRequest, RefusesWhatIsNotARequest) {
  for (const char* line :
       {"", "{", "null", "[]", R"({"pid": 1})",
        R"({"pid": 99999999999, "scope_id": "s", "expiration_time": 1, "signal": 9})",
        R"({"pid": 1, "scope_id": "s", "expiration_time": 1e999, "signal": 9})",
        R"({"pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 1e3})",
        R"({"pid": 1, "scope_id": null, "expiration_time": 1, "signal": 9})"}) {
    auto parsed = parse_timer_request(line);
    EXPECT_FALSE(parsed.request) << line;
    EXPECT_FALSE(parsed.error.empty()) << line;
  }
}

TEST(FileTimers, ChoosesAsTorchDoesAndDropsTheWholeWorker) {
  using C = FileTimers::Clock;
  const auto t0 = C::now();
  FileTimers timers;
  timers.set(10, "quiet", t0 + 1ms, 0, 0);
  timers.set(10, "kill", t0 + 2ms, 9, 0);
  timers.set(11, "later", t0 + 1h, 9, 0);  // another process of worker 0, not due
  timers.set(20, "b", t0 + 3ms, 15, 1);
  timers.set(30, "c", t0 + 1h, 9, 2);
  EXPECT_EQ(timers.earliest(), t0 + 1ms);
  timers.release(20, "b");
  timers.release(20, "nothing");

  auto expired = timers.take_expired(t0 + 5ms);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].scope, "kill");  // the first due that asks for a signal
  EXPECT_EQ(expired[0].signal, 9);
  EXPECT_EQ(timers.size(), 1u);  // worker 0's timers are gone, not due or not
  EXPECT_EQ(timers.earliest(), t0 + 1h);
  timers.drop_worker(2);
  EXPECT_FALSE(timers.earliest());
}

}  // namespace
}  // namespace ddprun::agent::test
