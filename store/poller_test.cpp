// The server's epoll set (Poller) and its send fan-out (FanOut), on their own.
#include "store/poller.hpp"

#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "store/fan_out.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::store::detail {
namespace {

using namespace std::chrono_literals;

struct Recorder : PollHandler {
  void on_events(uint32_t events) override {
    ++calls;
    last = events;
    if (then) then();
  }
  int calls = 0;
  uint32_t last = 0;
  std::function<void()> then;
};

struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    ours.reset(fds[0]);
    theirs.reset(fds[1]);
  }
  void poke() { EXPECT_EQ(::write(theirs.get(), "x", 1), 1); }
  void drain() {
    char buf[64];
    while (::read(ours.get(), buf, sizeof buf) > 0) {
    }
  }
  sys::UniqueFd ours, theirs;
};

void spin(boost::asio::io_context& io, std::chrono::milliseconds for_) {
  io.restart();
  io.run_for(for_);
}

TEST(PollerTest, EventsReachTheHandlerUntilRemovedAndAReusedSlotIsNotConfused) {
  boost::asio::io_context io;
  Poller poller(io);
  poller.start(nullptr);
  Pair a;
  Recorder first, second;
  Poller::Token t1 = poller.add(a.ours.get(), first);
  ASSERT_NE(t1, 0u);
  spin(io, 50ms);  // the registration itself reports "writable"
  first.calls = 0;
  a.poke();
  spin(io, 100ms);
  EXPECT_EQ(first.calls, 1);
  EXPECT_TRUE(first.last & EPOLLIN);
  a.drain();

  poller.remove(t1);
  poller.remove(t1);  // twice is harmless
  // The same descriptor, re-registered, lands in the freed slot with a new generation.
  Pair b;
  Poller::Token t2 = poller.add(b.ours.get(), second);
  ASSERT_NE(t2, 0u);
  EXPECT_EQ(static_cast<uint32_t>(t2), static_cast<uint32_t>(t1));  // same slot
  EXPECT_NE(t2, t1);                                                // new generation
  a.poke();  // still registered with epoll, but removed: dropped
  b.poke();
  spin(io, 100ms);
  EXPECT_EQ(first.calls, 1);
  EXPECT_GE(second.calls, 1);
  poller.close();
}

TEST(PollerTest, AHandlerRemovedEarlierInTheSameBatchGetsNothing) {
  boost::asio::io_context io;
  Poller poller(io);
  Pair a, b;
  Recorder ha, hb;
  Poller::Token ta = poller.add(a.ours.get(), ha);
  Poller::Token tb = poller.add(b.ours.get(), hb);
  // Whichever runs first removes the other, which is already in the same epoll batch.
  ha.then = [&] { poller.remove(tb); };
  hb.then = [&] { poller.remove(ta); };
  a.poke();
  b.poke();
  poller.start(nullptr);  // both are ready before the first wait
  spin(io, 100ms);
  EXPECT_EQ(ha.calls + hb.calls, 1);
  poller.close();
}

TEST(PollerTest, ClosingStopsTheWaitAndReleasesTheOwner) {
  boost::asio::io_context io;
  auto owner = std::make_shared<int>(0);
  {
    Poller poller(io);
    poller.start(owner);
    EXPECT_EQ(owner.use_count(), 2);
    poller.close();
    spin(io, 50ms);
    EXPECT_EQ(owner.use_count(), 1);
  }
}

TEST(FanOutTest, EveryItemRunsExactlyOnceAcrossJobsAndThreads) {
  FanOut fan(3);
  for (size_t n : {0, 1, 16, 17, 100, 10000}) {
    std::vector<std::atomic<int>> seen(n);
    std::mutex m;
    std::set<std::thread::id> threads;
    fan.run(n, [&](size_t i) {
      seen[i].fetch_add(1);
      std::lock_guard<std::mutex> lock(m);
      threads.insert(std::this_thread::get_id());
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i].load(), 1) << "n=" << n << " i=" << i;
    EXPECT_LE(threads.size(), 4u);
  }
}

TEST(FanOutTest, HelpersShareABigJob) {
  FanOut fan(2);
  std::mutex m;
  std::set<std::thread::id> threads;
  // Items slow enough that the helpers wake before the caller is done alone.
  fan.run(400, [&](size_t) {
    std::this_thread::sleep_for(100us);
    std::lock_guard<std::mutex> lock(m);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_GE(threads.size(), 2u);
}

TEST(FanOutTest, NoHelpersRunsOnTheCaller) {
  FanOut fan(0);
  std::set<std::thread::id> threads;
  fan.run(1000, [&](size_t) { threads.insert(std::this_thread::get_id()); });
  EXPECT_EQ(threads, std::set<std::thread::id>{std::this_thread::get_id()});
}

}  // namespace
}  // namespace ddprun::store::detail
