// store_loadgen: drives a TCPStore server (ours or torch's) with one scenario and prints one
// "result key=value ..." line. tests/bench/store runs it against both servers.
//
//   store_loadgen --port P --scenario setget|hotadd|waitall|idle|storm [--conns N]
//                 [--seconds S] [--dialect 1|2] [--threads T] [--idle N] [--server-pid PID]
//                 [--host 127.0.0.1] [--drops 0|1] [--tag T] [--sources N]
//                 [--ports-file F --per-port N] [--rank-offset R --world W]
//
// storm: the init storm of --conns ranks (storm.hpp); with --server-pid it also reports the
// server's CPU seconds, its RSS before and after, and its peak RSS (VmHWM). With --ports-file
// (the ports store_proxy_host wrote) each group of --per-port clients connects to its own proxy;
// --rank-offset and --world split one storm over several generator processes.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "store/bench/load_conn.hpp"
#include "store/bench/storm.hpp"
#include "store/wire.hpp"

namespace ddprun::store::bench {
namespace {

struct Options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string scenario;
  size_t conns = 1;
  double seconds = 3;
  Dialect dialect = Dialect::kTorch1;
  long server_pid = 0;
  size_t threads = 1;  // setget/hotadd: connections are split over this many epoll loops
  size_t idle = 0;     // setget: extra connections held open (and never used) meanwhile
  bool drops = false;  // storm: a tenth of the clients vanish mid-handshake and mid-WAIT
  std::string tag = "0";
  size_t sources = 1;           // storm: source addresses 127.0.0.1.. (beyond 28k ports per source)
  std::vector<uint16_t> ports;  // storm: through proxies (--ports-file)
  size_t per_port = 8;
  size_t rank_offset = 0;
  size_t world = 0;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "store_loadgen: %s\n", why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--host")
      o.host = value;
    else if (flag == "--port")
      o.port = static_cast<uint16_t>(std::stoi(value));
    else if (flag == "--scenario")
      o.scenario = value;
    else if (flag == "--conns")
      o.conns = std::stoul(value);
    else if (flag == "--seconds")
      o.seconds = std::stod(value);
    else if (flag == "--dialect")
      o.dialect = value == "2" ? Dialect::kTorch2 : Dialect::kTorch1;
    else if (flag == "--server-pid")
      o.server_pid = std::stol(value);
    else if (flag == "--threads")
      o.threads = std::max<size_t>(1, std::stoul(value));
    else if (flag == "--idle")
      o.idle = std::stoul(value);
    else if (flag == "--drops")
      o.drops = value == "1";
    else if (flag == "--tag")
      o.tag = value;
    else if (flag == "--sources")
      o.sources = std::max<size_t>(1, std::stoul(value));
    else if (flag == "--ports-file") {
      std::ifstream in(value);
      for (unsigned p = 0; in >> p;) o.ports.push_back(static_cast<uint16_t>(p));
      if (o.ports.empty()) usage("no ports in " + value);
    } else if (flag == "--per-port")
      o.per_port = std::max<size_t>(1, std::stoul(value));
    else if (flag == "--rank-offset")
      o.rank_offset = std::stoul(value);
    else if (flag == "--world")
      o.world = std::stoul(value);
    else
      usage("unknown option " + flag);
  }
  if ((o.port == 0 && o.ports.empty()) || o.scenario.empty()) {
    usage("--port (or --ports-file) and --scenario are required");
  }
  return o;
}

long proc_status_kb(long pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(field.size()));
  }
  return -1;
}

long vm_rss_kb(long pid) {
  return proc_status_kb(pid, "VmRSS:");
}

// utime + stime of a process, in seconds.
double cpu_seconds(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(stat.substr(paren + 2));
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stoull(f);
    if (i == 15) stime = std::stoull(f);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

size_t failures(const std::vector<Conn>& conns) {
  size_t n = 0;
  for (const Conn& c : conns) n += c.failed;
  return n;
}

uint64_t total_done(const std::vector<Conn>& conns) {
  uint64_t n = 0;
  for (const Conn& c : conns) n += c.done;
  return n;
}

// Runs one Driver per thread over an equal share of the connections; returns the time the
// last reply arrived. `make_driver(t)` builds thread t's driver (its callbacks get indexes
// into the whole `conns`).
template <typename MakeDriver>
Clock::time_point run_threads(std::vector<Conn>& conns, size_t threads, Clock::time_point stop,
                              bool send_first, MakeDriver make_driver) {
  threads = std::min(threads, std::max<size_t>(1, conns.size()));
  std::vector<std::vector<Conn>> shares(threads);
  std::vector<std::vector<size_t>> index(threads);
  for (size_t i = 0; i < conns.size(); ++i) {
    shares[i % threads].push_back(std::move(conns[i]));
    index[i % threads].push_back(i);
  }
  std::vector<Clock::time_point> last(threads);
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      Driver d = make_driver(t);
      Driver local;
      local.next = [&](size_t j, Conn& c) { return d.next(index[t][j], c); };
      local.check = [&](size_t j, Conn& c) { return d.check(index[t][j], c); };
      last[t] = local.run(shares[t], stop, stop + std::chrono::seconds(60), send_first);
    });
  }
  for (auto& w : workers) w.join();
  for (size_t t = 0; t < threads; ++t) {
    for (size_t j = 0; j < shares[t].size(); ++j) conns[index[t][j]] = std::move(shares[t][j]);
  }
  return *std::max_element(last.begin(), last.end());
}

void print(const Options& o, const std::string& metrics, size_t errors) {
  std::printf("result scenario=%s conns=%zu dialect=%s %s errors=%zu\n", o.scenario.c_str(),
              o.conns, o.dialect == Dialect::kTorch1 ? "1.13" : "2.x", metrics.c_str(), errors);
  std::fflush(stdout);
}

// One GETNUMKEYS round trip on every connection (pipelined over all of them).
void serve_once(std::vector<Conn>& conns, const Frames& f, Clock::time_point deadline) {
  for (Conn& c : conns) {
    if (!c.failed && !send_all(c, f.num_keys(), deadline)) c.failed = true;
  }
  for (Conn& c : conns) {
    if (!c.failed && !recv_exact(c, 8, deadline)) c.failed = true;
  }
}

// set+get pairs (SET then GET of the same key, sent together) per second.
void run_setget(const Options& o, const Frames& f) {
  auto deadline = Clock::now() + std::chrono::seconds(60);
  std::vector<Conn> idle = connect_all(o.host, o.port, o.idle, o.dialect, deadline);
  serve_once(idle, f, deadline);  // accepted and served: idle, not queued in the backlog
  std::vector<Conn> conns = connect_all(o.host, o.port, o.conns, o.dialect, deadline);
  const std::string value(100, 'v');
  std::vector<std::string> requests(conns.size());
  for (size_t i = 0; i < conns.size(); ++i) {
    std::string key = "/bench/setget/" + std::to_string(i);
    requests[i] = f.set(key, value) + f.get(key);
  }
  auto start = Clock::now();
  auto stop =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  auto last = run_threads(conns, o.threads, stop, true, [&](size_t) {
    Driver d;
    d.next = [&](size_t i, Conn& c) {
      c.want = 8 + value.size();
      return requests[i];
    };
    d.check = [&](size_t, Conn& c) { return c.in.compare(8, std::string::npos, value) == 0; };
    return d;
  });
  double secs = std::chrono::duration<double>(last - start).count();
  uint64_t pairs = total_done(conns);
  char m[160];
  std::snprintf(m, sizeof m, "idle=%zu pairs=%llu seconds=%.3f pairs_per_sec=%.0f", o.idle,
                static_cast<unsigned long long>(pairs), secs, pairs / secs);
  print(o, m, failures(conns) + failures(idle));
}

// ADD +1 on one hot key from every connection; checks the final count.
void run_hotadd(const Options& o, const Frames& f) {
  auto deadline = Clock::now() + std::chrono::seconds(60);
  std::vector<Conn> conns = connect_all(o.host, o.port, o.conns, o.dialect, deadline);
  // A key of this run's own: the count check below needs it to start from zero.
  const std::string request = f.add("/bench/hot/" + std::to_string(::getpid()), 1);
  std::vector<int64_t> max_seen(o.threads, 0);
  auto start = Clock::now();
  auto stop =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  auto last = run_threads(conns, o.threads, stop, true, [&](size_t t) {
    Driver d;
    d.next = [&](size_t, Conn& c) {
      c.want = 8;
      return request;
    };
    d.check = [&, t](size_t, Conn& c) {
      auto v = static_cast<int64_t>(wire::load_le(c.in.data(), 8));
      max_seen[t] = std::max(max_seen[t], v);
      return true;
    };
    return d;
  });
  int64_t final_count = *std::max_element(max_seen.begin(), max_seen.end());
  double secs = std::chrono::duration<double>(last - start).count();
  uint64_t adds = total_done(conns);
  // Every ADD is counted exactly once: the largest value returned equals the number done.
  size_t errors = failures(conns) + (static_cast<uint64_t>(final_count) != adds ? 1 : 0);
  char m[200];
  std::snprintf(m, sizeof m, "adds=%llu final=%lld seconds=%.3f adds_per_sec=%.0f",
                static_cast<unsigned long long>(adds), static_cast<long long>(final_count), secs,
                adds / secs);
  print(o, m, errors);
}

// N connections park in WAIT on one key; one SET releases them all.
void run_waitall(const Options& o, const Frames& f) {
  auto deadline = Clock::now() + std::chrono::seconds(120);
  std::vector<Conn> conns = connect_all(o.host, o.port, o.conns, o.dialect, deadline);
  std::vector<Conn> control = connect_all(o.host, o.port, 1, o.dialect, deadline);
  for (size_t i = 0; i < conns.size(); ++i) {
    if (conns[i].failed) continue;
    std::string ready = f.set("/bench/ready/" + std::to_string(i), "1");
    if (!send_all(conns[i], ready + f.wait("/bench/go"), deadline)) conns[i].failed = true;
  }
  // Every SET applied means every connection's WAIT is at least queued behind it; a short
  // settle lets the servers park them all before the release is timed.
  size_t live = conns.size() - failures(conns);
  for (;;) {
    send_all(control[0], f.num_keys(), deadline);
    if (!recv_exact(control[0], 8, deadline) || Clock::now() > deadline) break;
    if (wire::load_le(control[0].in.data(), 8) >= live) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (Conn& c : conns) c.want = 1;
  auto start = Clock::now();
  send_all(control[0], f.set("/bench/go", "1"), deadline);
  auto last = run_threads(conns, o.threads, start, /*send_first=*/false, [&](size_t) {
    Driver d;
    d.next = [](size_t, Conn& c) {
      c.want = 1;
      return std::string();
    };
    d.check = [](size_t, Conn& c) { return c.in[0] == '\0'; };
    return d;
  });
  size_t released = total_done(conns);
  char m[200];
  std::snprintf(m, sizeof m, "released=%zu release_ms=%.2f", released,
                std::chrono::duration<double, std::milli>(last - start).count());
  print(o, m, failures(conns) + (o.conns - released));
}

// Server RSS growth with N idle connections (each served one request first).
void run_idle(const Options& o, const Frames& f) {
  if (o.server_pid <= 0) usage("idle needs --server-pid");
  long before = vm_rss_kb(o.server_pid);
  auto deadline = Clock::now() + std::chrono::seconds(120);
  std::vector<Conn> conns = connect_all(o.host, o.port, o.conns, o.dialect, deadline);
  serve_once(conns, f, deadline);
  long after = vm_rss_kb(o.server_pid);
  char m[200];
  std::snprintf(m, sizeof m, "rss_before_kb=%ld rss_after_kb=%ld kb_per_conn=%.2f", before, after,
                static_cast<double>(after - before) / static_cast<double>(o.conns));
  print(o, m, failures(conns));
}

// The init storm: every rank at once (storm.hpp).
void run_storm_scenario(const Options& o) {
  StormOptions so;
  so.host = o.host;
  so.port = o.port;
  so.clients = o.conns;
  so.threads = o.threads;
  so.dialect = o.dialect;
  so.drops = o.drops;
  so.tag = o.tag;
  so.source_addresses = o.sources;
  so.ports = o.ports;
  so.per_port = o.per_port;
  so.rank_offset = o.rank_offset;
  so.world = o.world;
  const long rss_before = o.server_pid > 0 ? vm_rss_kb(o.server_pid) : -1;
  const double cpu_before = o.server_pid > 0 ? cpu_seconds(o.server_pid) : 0;
  StormResult r = run_storm(so);
  const double cpu_after = o.server_pid > 0 ? cpu_seconds(o.server_pid) : 0;
  // The clients are closed by now; give the server a moment to see every close.
  long rss_after = -1, peak = -1;
  if (o.server_pid > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    rss_after = vm_rss_kb(o.server_pid);
    peak = proc_status_kb(o.server_pid, "VmHWM:");
  }
  char m[400];
  std::snprintf(m, sizeof m,
                "ranks=%zu completed=%zu failed=%zu resets=%zu dropped=%zu seconds=%.3f "
                "connect_s=%.3f server_cpu_s=%.3f rss_before_kb=%ld rss_after_kb=%ld "
                "peak_rss_kb=%ld",
                r.ranks, r.completed, r.failed, r.resets, r.dropped, r.seconds, r.connect_s,
                cpu_after - cpu_before, rss_before, rss_after, peak);
  print(o, m, r.failed);
}

}  // namespace
}  // namespace ddprun::store::bench

int main(int argc, char** argv) {
  using namespace ddprun::store::bench;
  Options o = parse(argc, argv);
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  Frames f{o.dialect};
  if (o.scenario == "setget")
    run_setget(o, f);
  else if (o.scenario == "hotadd")
    run_hotadd(o, f);
  else if (o.scenario == "waitall")
    run_waitall(o, f);
  else if (o.scenario == "idle")
    run_idle(o, f);
  else if (o.scenario == "storm")
    run_storm_scenario(o);
  else
    usage("unknown scenario " + o.scenario);
  return 0;
}
