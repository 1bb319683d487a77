#include "agent/hang_monitor.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "agent/process/log_dir.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;

namespace {

void log_stacks(const StackDump& dump) {
  char took[32];
  std::snprintf(took, sizeof took, "%.1f", std::chrono::duration<double>(dump.took).count());
  sys::log_line("  stacks: " + dump.path + " (" + took + " s)");
  for (const auto& line : dump.head) sys::log_line("    " + line);
  for (const auto& note : dump.notes) sys::log_line("  note: " + note);
}

constexpr size_t kMaxTraceBytes = 64 << 20;  // a dump of 2,000 entries is about 1 MB

std::string answer_path(const std::string& dir, int rank) {
  return dir + "/rank_" + std::to_string(rank) + ".json";
}

// The worker's answer, parsed; nullopt when it has none, or said why not (`note`).
// A dump file's bytes; nullopt when it is absent or over kMaxTraceBytes (`note` says so).
std::optional<std::string> read_dump(const std::string& path, std::string& note) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return std::nullopt;
  const auto size = static_cast<size_t>(std::max<std::streamoff>(in.tellg(), 0));
  if (size > kMaxTraceBytes) {
    note = "flight recorder dump over 64 MiB: not read";
    return std::nullopt;
  }
  std::string text(size, '\0');
  in.seekg(0);
  in.read(text.data(), static_cast<std::streamsize>(size));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

// The worker's answer (JSON), parsed; nullopt when it has none, or said why not (`note`).
std::optional<RankTrace> read_answer(const std::string& path, std::string& note) {
  auto dump = read_dump(path, note);
  if (!dump) return std::nullopt;
  const std::string& text = *dump;
  if (text.find("\"ddprun_no_trace\"") != std::string::npos && text.size() < 4096) {
    auto doc = nlohmann::json::parse(text, nullptr, false);
    if (doc.is_object() && doc["ddprun_no_trace"].is_string()) {
      note = doc["ddprun_no_trace"].get<std::string>();
      return std::nullopt;
    }
  }
  std::string error;
  auto trace = parse_flight_recorder_json(text, &error);
  if (!trace) note = "unreadable flight recorder dump (" + error + ")";
  return trace;
}

// torch's own dump of the rank (TORCH_FR_DUMP_TEMP_FILE<rank>, a pickle), e.g. NCCL's on a
// collective's timeout, written before that worker exited.
std::optional<RankTrace> read_torch_dump(const std::string& path, std::string& note) {
  auto dump = read_dump(path, note);
  if (!dump) return std::nullopt;
  std::string error;
  auto trace = parse_flight_recorder_pickle(*dump, &error);
  if (!trace) note = "unreadable torch flight recorder dump (" + error + ")";
  return trace;
}

}  // namespace

std::string worker_name(const Worker& w, pid_t pid) {
  return "rank " + std::to_string(w.global_rank) + " (local rank " + std::to_string(w.local_rank) +
         ", pid " + std::to_string(pid) + ")";
}

HangMonitor::HangMonitor(asio::io_context& io, const WorkerSpec& spec,
                         std::function<void(const Hang&)> on_hang)
    : io_(io), spec_(spec), runtime_dir_("ddprun-" + std::to_string(::getpid()) + "-") {
  std::string fifo;
  if (spec_.file_timer) {
    fifo = spec_.timer_file.empty() ? runtime_dir_.path() + "/timer.fifo" : spec_.timer_file;
  }
  watchdog_ =
      std::make_unique<Watchdog>(io_, HangOptions{spec_.hang_timeout, spec_.hang_start_timeout},
                                 runtime_dir_.path() + "/heartbeat.sock", fifo, std::move(on_hang));
}

AgentEndpoints HangMonitor::endpoints() const {
  AgentEndpoints e;
  e.heartbeat_socket = watchdog_->heartbeat_path();
  e.timer_file = watchdog_->timer_fifo_path();
  return e;
}

void HangMonitor::watch(std::vector<WatchedWorker> workers) {
  pending_.clear();
  hung_.clear();
  places_.clear();
  timed_out_.clear();
  verdict_ = {};
  watchdog_->watch(std::move(workers));
}

asio::awaitable<StackDump> HangMonitor::stacks_of(pid_t pid, const AttemptView& attempt,
                                                  int local_rank) {
  const std::string path = attempt.log_dir + "/" + std::to_string(local_rank) + "/stacks.txt";
  StackDump dump;
  try {
    dump = co_await dump_stacks(io_.get_executor(), pid, path, spec_.stack_timeout);
  } catch (const std::exception& e) {
    dump.notes.push_back(std::string("no stacks: ") + e.what());
  }
  co_return dump;
}

asio::awaitable<void> HangMonitor::capture(const AttemptView& attempt, const Observers& observers,
                                           std::set<int>& reported) {
  watchdog_->unwatch();     // the group is stopping: one report per hang
  request_traces(attempt);  // the workers answer while their stacks are taken
  const int round_attempt = attempt.group.round().restart_count;
  while (!pending_.empty()) {
    const Hang hang = pending_.front();
    pending_.erase(pending_.begin());
    const Worker& w = attempt.group.workers().at(hang.local_rank);
    const int64_t found_at = static_cast<int64_t>(std::time(nullptr));
    sys::log_line(worker_name(w, hang.pid) + " hung: " + hang.describe() +
                  ": capturing its stacks");
    StackDump dump = co_await stacks_of(hang.pid, attempt, hang.local_rank);
    if (hang.kind == Hang::Kind::kTimerExpired) {
      // torch's FileTimer contract: the scope's signal goes to the process that asked (the
      // watchdog checked it is this worker or in its process group, which is not reaped yet).
      ::kill(hang.pid, hang.signal);
    }
    log_stacks(dump);
    observers.each(
        [&](AgentObserver& o) { o.on_hang_captured(hang, w.global_rank, dump, round_attempt); });
    reported.insert(hang.local_rank);
    places_[hang.local_rank] = dump.place;
    hung_.push_back({hang, std::move(dump), found_at});
  }
  co_await capture_silent_peers(attempt);
}

void HangMonitor::request_traces(const AttemptView& attempt) {
  const std::string dir = flight_recorder_dir(attempt.log_dir);
  requested_ = std::chrono::steady_clock::now();
  for (const Worker& w : attempt.group.workers()) {
    ::unlink(answer_path(dir, w.global_rank).c_str());
  }
  // A new file (temp + rename: a new inode) is a new request to the responders.
  const std::string tmp = dir + "/request.tmp";
  std::ofstream(tmp) << attempt.group.round().restart_count << "\n";
  if (::rename(tmp.c_str(), (dir + "/request").c_str()) != 0) {
    sys::log_line("  note: cannot ask the workers for their flight recorders in " + dir);
  }
}

bool HangMonitor::note_collective_timeouts(const std::vector<ProcessFailure>& failures) {
  static constexpr std::string_view kSigns[] = {"Timed out waiting",
                                                "collective operation timeout"};
  bool any = false;
  for (const ProcessFailure& f : failures) {
    std::vector<std::string_view> texts{f.message, f.traceback};
    for (const auto& line : f.stderr_tail) texts.push_back(line);
    for (std::string_view text : texts) {
      auto at = std::string_view::npos;
      for (std::string_view sign : kSigns) at = std::min(at, text.find(sign));
      if (at == std::string_view::npos) continue;
      std::string_view rest = text.substr(at);
      std::string frame(rest.substr(0, std::min<size_t>(rest.find('\n'), 120)));
      places_[f.local_rank] = {StackPlace::Where::kInCollective, "", frame};
      timed_out_.insert(f.local_rank);
      sys::log_line("rank " + std::to_string(f.global_rank) + " (local rank " +
                    std::to_string(f.local_rank) + ", pid " + std::to_string(f.pid) +
                    ") failed in a collective's timeout (" + frame +
                    "): asking the others for their flight recorders");
      any = true;
      break;
    }
  }
  return any;
}

asio::awaitable<void> HangMonitor::capture_for_peer(const AttemptView& attempt) {
  watchdog_->unwatch();
  request_traces(attempt);
  co_await capture_silent_peers(attempt);
}

asio::awaitable<std::vector<RankEvidence>> HangMonitor::local_evidence(const AttemptView& attempt) {
  const std::string dir = flight_recorder_dir(attempt.log_dir);
  const auto& workers = attempt.group.workers();
  auto unanswered = [&] {
    size_t n = 0;
    for (const Worker& w : workers) {
      struct stat st {};
      if (!attempt.processes.exit_of(w.local_rank) &&
          ::stat(answer_path(dir, w.global_rank).c_str(), &st) != 0) {
        ++n;
      }
    }
    return n;
  };
  asio::steady_timer timer(io_);
  while (unanswered() > 0 && std::chrono::steady_clock::now() < requested_ + kTraceWait) {
    timer.expires_after(std::chrono::milliseconds(20));
    co_await timer.async_wait(asio::use_awaitable);
  }
  std::vector<RankEvidence> evidence;
  std::vector<std::string> notes;
  size_t traced = 0;
  for (const Worker& w : workers) {
    RankEvidence r;
    r.rank = w.global_rank;
    r.host = sys::fq_host_name();
    r.pid = attempt.processes.pid_of(w.local_rank);
    std::string note;
    r.trace = read_answer(answer_path(dir, w.global_rank), note);
    if (!r.trace) {
      std::string torch_note;
      r.trace = read_torch_dump(dir + "/rank_" + std::to_string(w.global_rank), torch_note);
      if (r.trace) note.clear();
    }
    if (r.trace) ++traced;
    if (!note.empty()) notes.push_back("rank " + std::to_string(w.global_rank) + ": " + note);
    if (auto p = places_.find(w.local_rank); p != places_.end()) r.place = p->second;
    r.timed_out = timed_out_.count(w.local_rank) > 0;
    evidence.push_back(std::move(r));
  }
  sys::log_line("  flight recorders: " + std::to_string(traced) + " of " +
                std::to_string(workers.size()) + " workers answered" +
                (notes.empty() ? std::string() : " (" + notes.front() + ")"));
  co_return evidence;
}

void HangMonitor::judge(const AttemptView& attempt, const std::vector<RankEvidence>& evidence,
                        const Observers& observers) {
  const auto& workers = attempt.group.workers();
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  verdict_ =
      judge_collective_hang(evidence, workers.empty() ? 0 : workers.front().world_size,
                            std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
  if (verdict_.line.empty()) return;
  sys::log_line("collective hang: " + verdict_.line);
  const int round_attempt = attempt.group.round().restart_count;
  observers.each([&](AgentObserver& o) { o.on_collective_judged(verdict_, round_attempt); });
}

// In a collective hang every rank goes silent at about the same moment, and the first one
// reported need not be the culprit: the stacks of the node's other workers that have been
// silent for half the timeout are saved too (not judged: only the reported ones are hung).
asio::awaitable<void> HangMonitor::capture_silent_peers(const AttemptView& attempt) {
  if (spec_.hang_timeout.count() <= 0) co_return;
  const auto now = std::chrono::steady_clock::now();
  std::set<int> done;
  for (const auto& h : hung_) done.insert(h.hang.local_rank);
  for (const Worker& w : attempt.group.workers()) {
    if (done.count(w.local_rank) || attempt.processes.exit_of(w.local_rank)) continue;
    auto beat = watchdog_->last_beat(w.local_rank);
    if (!beat || now - *beat < spec_.hang_timeout / 2) continue;
    const pid_t pid = attempt.processes.pid_of(w.local_rank);
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - *beat);
    sys::log_line(worker_name(w, pid) + " has been silent for " + sys::seconds_text(silent) +
                  " as well: capturing its stacks");
    StackDump dump = co_await stacks_of(pid, attempt, w.local_rank);
    places_[w.local_rank] = dump.place;
    if (dump.path.empty()) {
      for (const auto& note : dump.notes) sys::log_line("  " + note);
    } else {
      log_stacks(dump);
    }
  }
}

asio::awaitable<std::set<int>> HangMonitor::capture_exit_hangs(const AttemptView& attempt,
                                                               const Observers& observers) {
  std::set<int> running;
  for (const Worker& w : attempt.group.workers()) {
    if (!attempt.processes.exit_of(w.local_rank)) running.insert(w.local_rank);
  }
  watchdog_->unwatch();
  for (int local_rank : running) {
    const Worker& w = attempt.group.workers().at(local_rank);
    const pid_t pid = attempt.processes.pid_of(local_rank);
    const std::string why = "has not exited " + sys::seconds_text(spec_.exit_timeout) +
                            " after another worker of this node exited 0";
    sys::log_line(worker_name(w, pid) + " " + why + ": capturing its stacks");
    StackDump dump = co_await stacks_of(pid, attempt, local_rank);
    log_stacks(dump);
    const StartedWorker started{local_rank, w.global_rank, pid};
    observers.each([&](AgentObserver& o) {
      o.on_exit_hang(started, why, dump, attempt.group.round().restart_count);
    });
  }
  co_return running;
}

void HangMonitor::add_failures(const AttemptView& attempt,
                               std::vector<ProcessFailure>& failures) const {
  for (const Hung& h : hung_) {
    const int local_rank = h.hang.local_rank;
    const Worker& w = attempt.group.workers().at(local_rank);
    const auto& e = attempt.processes.exit_of(local_rank);
    ProcessFailure f =
        make_failure(local_rank, w.global_rank, attempt.processes.pid_of(local_rank),
                     e ? e->status : ExitStatus::signaled(SIGKILL),
                     attempt.processes.launch_of(local_rank).error_file, h.unix_time, 0);
    f.timestamp = h.unix_time;  // found hung then, whatever its error file says later
    f.hang = h.hang.describe();
    f.stacks_path = h.stacks.path;
    f.stack_head = h.stacks.head;
    failures.push_back(std::move(f));
  }
  // Every failure of the attempt (a worker that died of the collective's timeout too) carries
  // the judgement.
  for (ProcessFailure& f : failures) {
    if (f.collective.empty()) f.collective = verdict_.line;
  }
}

}  // namespace ddprun::agent
