#include "agent/hang/watchdog.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <system_error>

#include "agent/hang/timer_request.hpp"
#include "agent/process/exit_status.hpp"
#include "store/sys/log.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;
using std::chrono::milliseconds;

namespace {

// At most one log line per this much time for malformed FileTimer requests.
constexpr std::chrono::seconds kBadRequestLogInterval{10};
// Expiration times further ahead than this (about 115 days) are taken as this.
constexpr double kMaxTimerSeconds = 1e7;

// Whole tenths of a second: what a person wants to read about a deadline.
milliseconds tenths(milliseconds d) {
  return milliseconds((d.count() + 50) / 100 * 100);
}

std::string printable(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return out;
}

// torch's clients send absolute wall-clock times; the deadline is kept on the steady clock,
// converted once, when the request arrives, so a wall-clock step cannot fire or delay it.
Watchdog::Clock::time_point steady_deadline(double expiration_time) {
  using namespace std::chrono;
  const double now = duration<double>(system_clock::now().time_since_epoch()).count();
  const double remaining = std::clamp(expiration_time - now, 0.0, kMaxTimerSeconds);
  return Watchdog::Clock::now() +
         duration_cast<Watchdog::Clock::duration>(duration<double>(remaining));
}

}  // namespace

std::string Hang::describe() const {
  switch (kind) {
    case Kind::kNoHeartbeat:
      return "no heartbeat for " + sys::seconds_text(tenths(silent_for));
    case Kind::kNoFirstHeartbeat:
      return "no first heartbeat within " + sys::seconds_text(tenths(silent_for)) + " of start";
    case Kind::kTimerExpired: {
      std::string text = "timer scope '" + printable(scope) + "' expired";
      if (pid != worker_pid) text += " in pid " + std::to_string(pid);
      text += signal > 0 ? " (signal " + signal_name(signal) + ")" : " (no signal requested)";
      return text;
    }
  }
  return "hung";
}

struct Watchdog::Watched {
  Watched(asio::io_context& io, const WatchedWorker& w) : worker(w), timer(io) {}

  WatchedWorker worker;
  asio::steady_timer timer;  // armed at the worker's heartbeat deadline, if it has one
  uint64_t arm_id = 0;       // the wait on `timer` that counts (0: none)
  std::optional<Clock::time_point> last_beat;
  bool judged = true;
};

Watchdog::Watchdog(asio::io_context& io, HangOptions options, std::string heartbeat_path,
                   std::string timer_fifo_path, HangCallback on_hang)
    : io_(io),
      options_(options),
      heartbeat_path_(std::move(heartbeat_path)),
      timer_fifo_path_(std::move(timer_fifo_path)),
      on_hang_(std::move(on_hang)),
      file_timer_(io) {
  // The components own their descriptors and guard their own late completions; while they
  // live, so does this Watchdog, so their callbacks may use `this`.
  if (!heartbeat_path_.empty()) {
    heartbeat_ = std::make_unique<HeartbeatSocket>(
        io_, heartbeat_path_, [this](pid_t sender, Clock::time_point at) { on_beat(sender, at); },
        kCoalesce);
  }
  if (!timer_fifo_path_.empty()) {
    fifo_ = std::make_unique<TimerFifo>(
        io_, timer_fifo_path_,
        [this](std::string_view line, bool too_long) { on_timer_line(line, too_long); }, kCoalesce);
  }
}

Watchdog::~Watchdog() {
  alive_.reset();
  fifo_.reset();
  heartbeat_.reset();
}

void Watchdog::watch(std::vector<WatchedWorker> workers) {
  unwatch();
  workers_.clear();
  watched_since_ = Clock::now();
  for (const auto& w : workers) workers_.push_back(std::make_unique<Watched>(io_, w));
  if (!timer_fifo_path_.empty()) open_fifo();
  for (size_t i = 0; i < workers_.size(); ++i) arm_beat_timer(i);
}

void Watchdog::unwatch() {
  for (size_t i = 0; i < workers_.size(); ++i) stop_judging(i);
  file_timers_.clear();
  file_timer_arm_id_ = 0;
  file_timer_deadline_.reset();
  file_timer_.cancel();
}

void Watchdog::worker_exited(int local_rank) {
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i]->worker.local_rank == local_rank) stop_judging(i);
  }
}

std::optional<Watchdog::Clock::time_point> Watchdog::last_beat(int local_rank) const {
  for (const auto& w : workers_) {
    if (w->worker.local_rank == local_rank) return w->last_beat;
  }
  return std::nullopt;
}

// The pid rule: the worker itself, or a process in the worker's process group.
std::optional<size_t> Watchdog::worker_of(pid_t pid) const {
  if (pid <= 0) return std::nullopt;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i]->worker.pid == pid) return i;
  }
  const pid_t group = ::getpgid(pid);
  if (group <= 0) return std::nullopt;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i]->worker.pid == group) return i;
  }
  return std::nullopt;
}

// ---- heartbeats ----

std::optional<Watchdog::Clock::time_point> Watchdog::beat_deadline(const Watched& w) const {
  if (w.last_beat) {
    if (options_.hang_timeout <= milliseconds::zero()) return std::nullopt;
    return *w.last_beat + options_.hang_timeout;
  }
  if (options_.first_beat_timeout <= milliseconds::zero()) return std::nullopt;
  return watched_since_ + options_.first_beat_timeout;
}

void Watchdog::arm_beat_timer(size_t index) {
  Watched& w = *workers_[index];
  const auto deadline = beat_deadline(w);
  if (!w.judged || !deadline) {
    if (w.arm_id != 0) {
      w.arm_id = 0;
      w.timer.cancel();
    }
    return;
  }
  w.arm_id = ++next_arm_id_;
  w.timer.expires_at(*deadline);
  w.timer.async_wait(
      [this, alive = std::weak_ptr<char>(alive_), index, id = w.arm_id](boost::system::error_code) {
        if (!alive.expired()) on_beat_timer(index, id);
      });
}

// Beats only store a timestamp; the deadline is checked when the timer fires, and the timer
// re-armed if a beat has moved it since.
void Watchdog::on_beat_timer(size_t index, uint64_t arm_id) {
  if (index >= workers_.size() || workers_[index]->arm_id != arm_id) return;  // stale wait
  if (heartbeat_) heartbeat_->read_queued();  // beats still resting in the socket count
  Watched& w = *workers_[index];
  w.arm_id = 0;
  const auto deadline = beat_deadline(w);
  if (!w.judged || !deadline) return;
  const auto now = Clock::now();
  if (now < *deadline) {
    arm_beat_timer(index);
    return;
  }
  Hang hang;
  hang.kind = w.last_beat ? Hang::Kind::kNoHeartbeat : Hang::Kind::kNoFirstHeartbeat;
  hang.pid = w.worker.pid;
  hang.silent_for =
      std::chrono::duration_cast<milliseconds>(now - w.last_beat.value_or(watched_since_));
  report(index, std::move(hang));
}

void Watchdog::on_beat(pid_t sender, Clock::time_point at) {
  const auto index = worker_of(sender);
  if (!index) {
    ++ignored_;
    return;
  }
  ++beats_received_;
  Watched& w = *workers_[*index];
  const bool first = !w.last_beat;
  w.last_beat = at;
  // The first beat trades the first-beat deadline for hang_timeout, which may come sooner.
  if (first) arm_beat_timer(*index);
}

// ---- FileTimer ----

void Watchdog::open_fifo() {
  fifo_.reset();
  try {
    fifo_ = std::make_unique<TimerFifo>(
        io_, timer_fifo_path_,
        [this](std::string_view line, bool too_long) { on_timer_line(line, too_long); }, kCoalesce);
  } catch (const std::system_error& e) {
    sys::log_line(std::string("hang watchdog: ") + e.what() +
                  "; FileTimer requests fail during this attempt");
  }
}

void Watchdog::on_timer_line(std::string_view line, bool too_long) {
  if (too_long) {
    note_bad_request("a line longer than " + std::to_string(TimerFifo::kMaxLine) + " bytes");
    return;
  }
  ParsedTimerRequest parsed = parse_timer_request(line);
  if (!parsed.request) {
    note_bad_request(parsed.error);
    return;
  }
  ++timer_requests_;
  TimerRequest& request = *parsed.request;
  if (request.is_release()) {
    file_timers_.release(request.pid, request.scope_id);
    return;
  }
  const auto index = worker_of(request.pid);
  if (!index || !workers_[*index]->judged) {
    ++ignored_;
    return;
  }
  const auto deadline = steady_deadline(request.expiration_time);
  file_timers_.set(request.pid, std::move(request.scope_id), deadline, request.signal, *index);
  if (!file_timer_deadline_ || deadline < *file_timer_deadline_) arm_file_timer(deadline);
}

void Watchdog::note_bad_request(const std::string& why) {
  ++bad_requests_;
  const auto now = Clock::now();
  if (last_bad_log_ && now - *last_bad_log_ < kBadRequestLogInterval) {
    ++bad_unlogged_;
    return;
  }
  std::string message =
      "hang watchdog: dropped a FileTimer request on " + timer_fifo_path_ + ": " + why;
  if (bad_unlogged_ > 0) {
    message += " (and " + std::to_string(bad_unlogged_) + " more since the last report)";
  }
  sys::log_line(message);
  last_bad_log_ = now;
  bad_unlogged_ = 0;
}

void Watchdog::arm_file_timer(Clock::time_point deadline) {
  file_timer_deadline_ = deadline;
  file_timer_arm_id_ = ++next_arm_id_;
  file_timer_.expires_at(deadline);
  file_timer_.async_wait([this, alive = std::weak_ptr<char>(alive_),
                          id = file_timer_arm_id_](boost::system::error_code) {
    if (!alive.expired()) on_file_timer(id);
  });
}

void Watchdog::on_file_timer(uint64_t arm_id) {
  if (arm_id != file_timer_arm_id_) return;  // stale wait
  if (fifo_) fifo_->read_queued();           // a release still resting in the pipe counts
  file_timer_arm_id_ = 0;
  file_timer_deadline_.reset();
  const auto now = Clock::now();
  for (FileTimers::Expired& expired : file_timers_.take_expired(now)) {
    if (expired.worker >= workers_.size() || !workers_[expired.worker]->judged) continue;
    Hang hang;
    hang.kind = Hang::Kind::kTimerExpired;
    hang.pid = expired.pid;
    hang.silent_for = std::chrono::duration_cast<milliseconds>(now - expired.deadline);
    hang.scope = std::move(expired.scope);
    hang.signal = expired.signal;
    report(expired.worker, std::move(hang));
  }
  if (auto next = file_timers_.earliest()) arm_file_timer(*next);
}

// ---- verdicts ----

void Watchdog::stop_judging(size_t index) {
  Watched& w = *workers_[index];
  w.judged = false;
  if (w.arm_id != 0) {
    w.arm_id = 0;
    w.timer.cancel();
  }
  file_timers_.drop_worker(index);
}

void Watchdog::report(size_t index, Hang hang) {
  const WatchedWorker& worker = workers_[index]->worker;
  hang.local_rank = worker.local_rank;
  hang.global_rank = worker.global_rank;
  hang.worker_pid = worker.pid;
  stop_judging(index);
  asio::post(io_, [this, alive = std::weak_ptr<char>(alive_), hang = std::move(hang)] {
    if (alive.expired() || !on_hang_) return;
    HangCallback callback = on_hang_;  // the callback may destroy this Watchdog
    callback(hang);
  });
}

}  // namespace ddprun::agent
