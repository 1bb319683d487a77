#include "agent/process/kill_cause.hpp"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ddprun::agent {
namespace {

constexpr size_t kMaxLoggedKills = 256;       // OOM kills remembered from the kernel log
constexpr size_t kMaxRecordsPerRead = 20000;  // kernel log records read per look, at most

std::optional<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<uint64_t> to_u64(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p == s.data()) return std::nullopt;
  return v;
}

// The number after `key` in `text` ("anon-rss:" -> 108928 of "anon-rss:108928kB").
std::optional<uint64_t> number_after(std::string_view text, std::string_view key) {
  size_t at = text.find(key);
  if (at == std::string_view::npos) return std::nullopt;
  return to_u64(text.substr(at + key.size()));
}

// The value of "key=value" in a comma-separated list ("oom_memcg=/x,task=python3,...").
std::optional<std::string> field(std::string_view text, std::string_view key) {
  size_t at = 0;
  while ((at = text.find(key, at)) != std::string_view::npos) {
    if (at == 0 || text[at - 1] == ',' || text[at - 1] == ':') {
      size_t start = at + key.size();
      size_t end = text.find(',', start);
      return std::string(text.substr(start, end == std::string_view::npos ? end : end - start));
    }
    at += key.size();
  }
  return std::nullopt;
}

// "oom_kill N" from memory.events (v2) or memory.oom_control (v1).
std::optional<uint64_t> oom_kill_line(std::string_view text) {
  size_t at = 0;
  while ((at = text.find("oom_kill ", at)) != std::string_view::npos) {
    if (at == 0 || text[at - 1] == '\n') return to_u64(text.substr(at + 9));
    at += 9;
  }
  return std::nullopt;
}

std::optional<uint64_t> node_oom_kills() {
  auto text = read_small_file("/proc/vmstat");
  return text ? oom_kill_line(*text) : std::nullopt;
}

// "node 10.3 of 23.5 GiB in use" from /proc/meminfo.
std::string node_memory() {
  auto text = read_small_file("/proc/meminfo");
  if (!text) return {};
  auto total = number_after(*text, "MemTotal:");
  auto available = number_after(*text, "MemAvailable:");
  if (!total || !available || *available > *total) return {};
  char buf[96];
  std::snprintf(buf, sizeof buf, "node %.1f of %.1f GiB in use",
                static_cast<double>(*total - *available) / (1 << 20),
                static_cast<double>(*total) / (1 << 20));
  return buf;
}

std::string peak(uint64_t peak_rss_kb) {
  return peak_rss_kb ? "peak rss " + format_bytes(peak_rss_kb * 1024) : std::string();
}

std::string parenthesised(std::initializer_list<std::string> parts) {
  std::string out;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    out += (out.empty() ? " (" : "; ") + p;
  }
  return out.empty() ? out : out + ")";
}

}  // namespace

bool parse_oom_log_line(std::string_view message, std::map<pid_t, OomKillRecord>& into) {
  if (size_t at = message.find("Killed process "); at != std::string_view::npos) {
    auto pid = to_u64(message.substr(at + 15));
    if (!pid) return false;
    OomKillRecord& r = into[static_cast<pid_t>(*pid)];
    r.pid = static_cast<pid_t>(*pid);
    r.rss_kb = number_after(message, "anon-rss:").value_or(0) +
               number_after(message, "file-rss:").value_or(0) +
               number_after(message, "shmem-rss:").value_or(0);
    return true;
  }
  if (message.rfind("oom-kill:", 0) == 0) {
    auto pid_text = field(message, "pid=");
    auto pid = pid_text ? to_u64(*pid_text) : std::nullopt;
    if (!pid) return false;
    OomKillRecord& r = into[static_cast<pid_t>(*pid)];
    r.pid = static_cast<pid_t>(*pid);
    // A global OOM names no oom_memcg; a cgroup's names the one whose limit was hit.
    auto memcg = field(message, "oom_memcg=");
    auto constraint = field(message, "constraint=");
    if (memcg && constraint && *constraint == "CONSTRAINT_MEMCG") r.memcg = *memcg;
    return true;
  }
  return false;
}

CgroupRef parse_proc_cgroup(std::string_view text) {
  CgroupRef v2;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    // "<id>:<controllers>:<path>"
    size_t a = line.find(':');
    size_t b = a == std::string_view::npos ? a : line.find(':', a + 1);
    if (b == std::string_view::npos) continue;
    std::string_view controllers = line.substr(a + 1, b - a - 1);
    std::string path(line.substr(b + 1));
    if (line.substr(0, a) == "0" && controllers.empty()) {
      v2 = {2, path};
      continue;
    }
    size_t start = 0;
    while (start <= controllers.size()) {
      size_t comma = controllers.find(',', start);
      if (comma == std::string_view::npos) comma = controllers.size();
      if (controllers.substr(start, comma - start) == "memory") return {1, path};
      start = comma + 1;
    }
  }
  return v2;
}

std::optional<ProcessMemory> read_process_memory(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  auto text = read_small_file("/proc/" + std::to_string(pid) + "/status");
  if (!text) return std::nullopt;
  auto rss = number_after(*text, "\nVmRSS:");
  auto hwm = number_after(*text, "\nVmHWM:");
  if (!rss) return std::nullopt;  // a zombie has no memory
  return ProcessMemory{*rss, hwm.value_or(*rss)};
}

std::string format_bytes(uint64_t bytes) {
  char buf[32];
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  } else if (bytes >= (uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%llu KiB", static_cast<unsigned long long>(bytes >> 10));
  }
  return buf;
}

KillCauses::KillCauses(std::string cgroup_root) : cgroup_root_(std::move(cgroup_root)) {
  int fd = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd >= 0) {
    kmsg_ = sys::UniqueFd(fd);
    ::lseek(fd, 0, SEEK_END);
    sources_ = "kernel log";
  } else {
    sources_ = std::string("no kernel log (/dev/kmsg: ") + std::strerror(errno) + ")";
  }
  auto self = read_small_file("/proc/self/cgroup");
  CgroupRef cg = self ? parse_proc_cgroup(*self) : CgroupRef{};
  if (cg.version && cgroup_oom_kills(cg)) {
    sources_ += ", memory cgroup v" + std::to_string(cg.version);
  } else {
    sources_ += ", no memory cgroup OOM count";
  }
  if (node_oom_kills()) sources_ += ", the node's OOM count";
}

std::string KillCauses::cgroup_dir(const CgroupRef& cg) const {
  std::string path = cg.path == "/" ? std::string() : cg.path;
  if (cg.version == 1) return cgroup_root_ + "/memory" + path;
  // v2: the unified hierarchy is the mount itself, or "unified" beside v1 ones (hybrid).
  std::string unified = cgroup_root_ + "/unified";
  if (::access((unified + "/cgroup.controllers").c_str(), F_OK) == 0) return unified + path;
  return cgroup_root_ + path;
}

std::optional<uint64_t> KillCauses::cgroup_oom_kills(const CgroupRef& cg) const {
  if (!cg.version) return std::nullopt;
  std::string file = cgroup_dir(cg) + (cg.version == 1 ? "/memory.oom_control" : "/memory.events");
  auto text = read_small_file(file);
  return text ? oom_kill_line(*text) : std::nullopt;
}

std::optional<uint64_t> KillCauses::cgroup_limit(const CgroupRef& cg) const {
  if (!cg.version) return std::nullopt;
  auto text = read_small_file(cgroup_dir(cg) +
                              (cg.version == 1 ? "/memory.limit_in_bytes" : "/memory.max"));
  if (!text) return std::nullopt;
  auto v = to_u64(*text);  // v2 "max": none; v1's unlimited is a huge number
  if (!v || *v >= (uint64_t{1} << 60)) return std::nullopt;
  return v;
}

void KillCauses::started(pid_t pid) {
  Watched w;
  auto text = read_small_file("/proc/" + std::to_string(pid) + "/cgroup");
  if (text) w.cgroup = parse_proc_cgroup(*text);
  w.oom_kills = cgroup_oom_kills(w.cgroup);
  w.node_oom_kills = node_oom_kills();
  watched_[pid] = std::move(w);
}

void KillCauses::forget(pid_t pid) {
  watched_.erase(pid);
}

void KillCauses::read_kernel_log() {
  if (!kmsg_) return;
  char buf[8192];
  for (size_t n = 0; n < kMaxRecordsPerRead; ++n) {
    ssize_t got = ::read(kmsg_.get(), buf, sizeof buf - 1);
    if (got < 0) {
      if (errno == EINTR || errno == EPIPE) continue;  // EPIPE: records overwritten, go on
      break;                                           // EAGAIN: read up to now
    }
    if (got == 0) break;
    // "<prio>,<seq>,<usec>,<flags>;<message>\n[ KEY=value\n...]"
    std::string_view record(buf, static_cast<size_t>(got));
    size_t semi = record.find(';');
    if (semi == std::string_view::npos) continue;
    std::string_view message = record.substr(semi + 1);
    message = message.substr(0, message.find('\n'));
    parse_oom_log_line(message, oom_kills_);
  }
  while (oom_kills_.size() > kMaxLoggedKills) oom_kills_.erase(oom_kills_.begin());
}

std::string KillCauses::explain(pid_t pid, const std::string& sent_by_ddprun,
                                uint64_t peak_rss_kb) {
  read_kernel_log();
  Watched w;
  if (auto it = watched_.find(pid); it != watched_.end()) w = it->second;

  std::optional<OomKillRecord> logged;
  if (auto it = oom_kills_.find(pid); it != oom_kills_.end()) logged = it->second;
  auto cg_now = cgroup_oom_kills(w.cgroup);
  bool cgroup_rose = w.oom_kills && cg_now && *cg_now > *w.oom_kills;
  auto node_now = node_oom_kills();
  bool node_rose = w.node_oom_kills && node_now && *node_now > *w.node_oom_kills;

  if (logged || cgroup_rose) {
    std::string rss =
        logged && logged->rss_kb ? "rss " + format_bytes(logged->rss_kb * 1024) : peak(peak_rss_kb);
    // The cgroup whose limit was hit: the kernel log names it; without the log, the worker's
    // own cgroup when it has a limit (one set higher up is not named).
    const std::string memcg = logged ? logged->memcg : w.cgroup.path;
    const auto limit = memcg.empty() ? std::nullopt : cgroup_limit({w.cgroup.version, memcg});
    std::string cgroup;
    if (logged ? !memcg.empty() : limit.has_value()) {
      cgroup = "memory cgroup " + memcg +
               (limit ? " at its limit of " + format_bytes(*limit) : std::string(" at its limit"));
    }
    return "killed by the kernel's OOM killer" + parenthesised({rss, cgroup, node_memory()});
  }
  if (!sent_by_ddprun.empty()) {
    return "killed by ddprun: SIGKILL " + sent_by_ddprun + parenthesised({peak(peak_rss_kb)});
  }
  std::string checked;
  if (kmsg_) checked = "the kernel log";
  if (cg_now) checked += std::string(checked.empty() ? "" : " or ") + "its memory cgroup";
  if (checked.empty()) {
    if (node_rose) {
      return "killed by SIGKILL while the kernel's OOM killer killed a process on this node "
             "(nothing here can say which)" +
             parenthesised({peak(peak_rss_kb), node_memory(), sources_});
    }
    return "killed by SIGKILL from outside ddprun, or by the OOM killer: nothing here can tell" +
           parenthesised({peak(peak_rss_kb), node_memory(), sources_});
  }
  return "killed by SIGKILL from outside ddprun, not by the OOM killer" +
         parenthesised({peak(peak_rss_kb), "no OOM kill of it in " + checked});
}

}  // namespace ddprun::agent
