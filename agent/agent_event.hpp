// The agent loop's input: typed events from its sources, in arrival order.
//
//   source                          event
//   ProcessContext (pidfd)          WorkerExited      a worker of the running attempt exited
//   RendezvousHandler               RoundEnded        another node, or the store, ended the round
//                                   PeerRecoveryBegan another node replaces its failed worker in
//                                                     process (--in-process-recovery)
//   SignalSource (signal_set)       SignalReceived    one of --signals-to-handle
//   the hang monitor (Watchdog)     HangFound         a worker judged hung (heartbeat, FileTimer)
//
// A source records what it saw (the exit in the process context, the signal in the agent) at
// once, then pushes the event; the loop pops events and decides (state_machine.hpp). A new
// capability that the loop must react to is a new source and one more event type here.
//
// Threads: the io_context thread only.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <deque>
#include <optional>
#include <variant>

#include "agent/hang/watchdog.hpp"
#include "store/sys/wakeup.hpp"

namespace ddprun::agent {

struct WorkerExited {
  int local_rank = 0;
};
struct RoundEnded {};
struct PeerRecoveryBegan {};
struct SignalReceived {
  int signal = 0;
};
struct HangFound {
  Hang hang;
};

using AgentEvent =
    std::variant<WorkerExited, RoundEnded, PeerRecoveryBegan, SignalReceived, HangFound>;

class EventQueue {
 public:
  using Clock = std::chrono::steady_clock;

  explicit EventQueue(const boost::asio::any_io_executor& executor) : wake_(executor) {}

  void push(AgentEvent event) {
    events_.push_back(std::move(event));
    wake_.notify();
  }

  // The next event, or nullopt once `deadline` passed with none.
  boost::asio::awaitable<std::optional<AgentEvent>> pop_until(Clock::time_point deadline) {
    while (events_.empty()) {
      if (!co_await wake_.wait_until(deadline)) co_return std::nullopt;
    }
    AgentEvent event = std::move(events_.front());
    events_.pop_front();
    co_return event;
  }

  // Forgets what is queued (a new attempt starts: its sources report afresh).
  void clear() { events_.clear(); }

 private:
  std::deque<AgentEvent> events_;
  sys::Wakeup wake_;
};

}  // namespace ddprun::agent
