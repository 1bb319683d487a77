// Watchdog: notices hung workers, two ways, entirely on the agent's io_context (no threads, no
// polling; a timer only where there is a real deadline).
//
// 1. Heartbeats. Workers send datagrams of any content to a Unix datagram socket
//    (heartbeat_path()). The sender is whoever the kernel says sent it (SCM_CREDENTIALS). With
//    hang_timeout, a worker that has beaten and then stays silent that long is hung
//    (kNoHeartbeat); with first_beat_timeout, one that has not beaten that long after watch()
//    is hung (kNoFirstHeartbeat).
// 2. torch's FileTimer protocol (torch.distributed.elastic.timer.FileTimerClient, with
//    `expires(after=...)`), served on a FIFO at timer_fifo_path(): a scope that is still open
//    at its expiration time is a hang (kTimerExpired), reported with the signal the client
//    asked for.
//
// Which worker a pid belongs to: the worker itself, or any process whose process group is the
// worker's (each worker leads its own group, so its data-loader processes count for it). Other
// pids are ignored.
//
// A worker is judged from watch() until it is reported hung once, worker_exited() names it,
// unwatch() is called or the next watch() starts a new attempt. The watchdog only reports;
// what to do with a hung worker (and its requested signal) is the agent's decision.
//
// Thread: everything, the callback included, runs on the io_context's thread. The callback is
// posted, never called from inside a Watchdog method; it may destroy the Watchdog.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/hang/file_timers.hpp"
#include "agent/hang/heartbeat_socket.hpp"
#include "agent/hang/timer_fifo.hpp"

namespace ddprun::agent {

struct WatchedWorker {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = 0;  // the worker, leader of its own process group
};

struct HangOptions {
  std::chrono::milliseconds hang_timeout{0};        // 0: heartbeats are recorded, never judged
  std::chrono::milliseconds first_beat_timeout{0};  // 0: no deadline for the first beat
};

struct Hang {
  enum class Kind { kNoHeartbeat, kNoFirstHeartbeat, kTimerExpired };
  Kind kind = Kind::kNoHeartbeat;
  int local_rank = 0;
  int global_rank = 0;
  pid_t worker_pid = 0;  // the worker
  pid_t pid = 0;         // the worker, or for kTimerExpired the pid that asked (maybe a child)
  // Since the last beat (kNoHeartbeat), since watch() (kNoFirstHeartbeat), past the expiration
  // time (kTimerExpired).
  std::chrono::milliseconds silent_for{0};
  std::string scope;  // kTimerExpired: the scope_id
  int signal = 0;     // kTimerExpired: the signal the client asked for (<= 0: no kill)

  // One line: "no heartbeat for 60 s", "no first heartbeat within 300 s of start",
  // "timer scope 'load_batch' expired (signal SIGKILL)".
  std::string describe() const;
};

class Watchdog {
 public:
  // How long the heartbeat socket and the FIFO rest after taking requests: the agent wakes at
  // most 100 times a second for them, however many workers beat how often (8 workers beating
  // every 10 ms would otherwise wake it 800 times). Deadlines read what is queued first.
  static constexpr std::chrono::milliseconds kCoalesce{10};

  using Clock = std::chrono::steady_clock;
  using HangCallback = std::function<void(const Hang&)>;

  // Binds the heartbeat socket at heartbeat_path (must fit a sockaddr_un; empty: no heartbeat
  // service) and, unless timer_fifo_path is empty, creates the FileTimer FIFO. Throws
  // std::system_error naming the path that failed.
  Watchdog(boost::asio::io_context& io, HangOptions options, std::string heartbeat_path,
           std::string timer_fifo_path, HangCallback on_hang);
  // Closes everything and unlinks the socket and the FIFO. Completions still queued on the
  // io_context afterwards touch nothing.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // A new attempt: forgets the previous workers, their beats and timers, recreates the FIFO
  // (a failure is logged; the attempt then runs without the FileTimer service) and starts the
  // first-beat deadlines. Call it right after the workers are spawned.
  void watch(std::vector<WatchedWorker> workers);
  // Stops judging (the group is stopping). Beats are still recorded.
  void unwatch();
  // Stops judging one worker (it exited); drops its FileTimer timers.
  void worker_exited(int local_rank);

  const std::string& heartbeat_path() const { return heartbeat_path_; }
  const std::string& timer_fifo_path() const { return timer_fifo_path_; }

  // For /metrics. The last beat of a local rank this attempt (nullopt: none yet).
  std::optional<Clock::time_point> last_beat(int local_rank) const;
  uint64_t beats_received() const { return beats_received_; }  // from a watched worker's pids
  uint64_t timer_requests() const { return timer_requests_; }  // well-formed FileTimer lines
  uint64_t bad_requests() const { return bad_requests_; }      // malformed or too long
  uint64_t ignored() const { return ignored_; }  // beats and acquires from pids of no worker

 private:
  struct Watched;

  std::optional<size_t> worker_of(pid_t pid) const;
  std::optional<Clock::time_point> beat_deadline(const Watched& w) const;
  void arm_beat_timer(size_t index);
  void on_beat_timer(size_t index, uint64_t arm_id);
  void on_beat(pid_t sender, Clock::time_point at);

  void open_fifo();
  void on_timer_line(std::string_view line, bool too_long);
  void note_bad_request(const std::string& why);
  void arm_file_timer(Clock::time_point deadline);
  void on_file_timer(uint64_t arm_id);

  void stop_judging(size_t index);
  void report(size_t index, Hang hang);

  boost::asio::io_context& io_;
  HangOptions options_;
  std::string heartbeat_path_;
  std::string timer_fifo_path_;
  HangCallback on_hang_;

  std::vector<std::unique_ptr<Watched>> workers_;
  Clock::time_point watched_since_;
  uint64_t next_arm_id_ = 0;  // every timer wait gets a new id; a stale completion sees a mismatch

  FileTimers file_timers_;
  boost::asio::steady_timer file_timer_;
  std::optional<Clock::time_point> file_timer_deadline_;  // where file_timer_ is armed
  uint64_t file_timer_arm_id_ = 0;

  uint64_t beats_received_ = 0;
  uint64_t timer_requests_ = 0;
  uint64_t bad_requests_ = 0;
  uint64_t ignored_ = 0;
  std::optional<Clock::time_point> last_bad_log_;
  uint64_t bad_unlogged_ = 0;

  std::unique_ptr<HeartbeatSocket> heartbeat_;
  std::unique_ptr<TimerFifo> fifo_;
  // Completions and posted callbacks that outlive the Watchdog check this before touching it.
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace ddprun::agent
