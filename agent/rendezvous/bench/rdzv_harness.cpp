// rdzv_harness: the rendezvous alone, driven N-fold in one process — N simulated nodes, one
// thread each, every one doing what an agent's StoreRendezvous does on its worker thread
// (two connections with keep-alive, the RoundProtocol join, the watcher's WAIT on the round's
// change key), without spawning workers. Used by tests/bench/rdzv for node counts where
// starting N real agents on one machine would measure the machine, not the rendezvous.
//
//   rdzv_harness --nodes N --endpoint HOST:PORT [--run-id ID] [--min N] [--last-call S]
//
// Prints one line: "nodes N formed_ms T median_ms M" where T is the time from the start
// until the last node has its rank (connections included), then makes the job finish
// (every node reports success) and exits 0; exits 1 with a message on any error.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "agent/rendezvous/round_protocol.hpp"

using namespace ddprun;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "rdzv_harness: %s\nusage: rdzv_harness --nodes N --endpoint HOST:PORT "
               "[--run-id ID] [--min N] [--last-call SECONDS]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int nodes = 0, min_nodes = 0;
  double last_call = 30;
  std::string host, run_id = "bench";
  int port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--nodes") {
      nodes = std::stoi(value);
    } else if (flag == "--min") {
      min_nodes = std::stoi(value);
    } else if (flag == "--last-call") {
      last_call = std::stod(value);
    } else if (flag == "--run-id") {
      run_id = value;
    } else if (flag == "--endpoint") {
      auto colon = value.rfind(':');
      if (colon == std::string::npos) usage("--endpoint needs HOST:PORT");
      host = value.substr(0, colon);
      port = std::stoi(value.substr(colon + 1));
    } else {
      usage(("unknown flag " + flag).c_str());
    }
  }
  if (nodes < 1 || host.empty()) usage("--nodes and --endpoint are required");
  if (min_nodes < 1) min_nodes = nodes;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);

  agent::RendezvousSettings s;
  s.run_id = run_id;
  s.min_nodes = min_nodes;
  s.max_nodes = nodes;
  s.last_call_timeout = agent::Millis(static_cast<long long>(last_call * 1000));
  s.join_timeout = std::chrono::seconds(120);
  s.read_timeout = std::chrono::seconds(120);

  std::vector<double> formed_ms(nodes, -1);
  std::atomic<int> failures{0};
  std::atomic<int> formed{0};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  threads.reserve(nodes);
  for (int i = 0; i < nodes; ++i) {
    threads.emplace_back([&, i] {
      try {
        store::ClientOptions o;
        o.connect_timeout = std::chrono::seconds(60);
        o.timeout = std::chrono::seconds(120);
        const std::string prefix = "/ddprun/" + run_id + "/";
        agent::PrefixClient main(store::Client::connect(host, static_cast<uint16_t>(port), o),
                                 prefix);
        agent::PrefixClient watch(store::Client::connect(host, static_cast<uint16_t>(port), o),
                                  prefix);
        main.keep_alive(s.keep_alive_interval, s.keep_alive_max_attempt);
        watch.keep_alive(s.keep_alive_interval, s.keep_alive_max_attempt);
        agent::NodeDesc self;
        self.addr = "10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
        self.id = self.addr + ":" + std::to_string(i) + ":bench";
        self.port = 20000 + i;
        agent::RoundProtocol protocol(main, s, self);
        agent::FormedRound f = protocol.join(nullptr, {});
        formed_ms[i] = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        formed.fetch_add(1);
        // What the agent's watcher does for the running round, then the end of the job.
        std::thread watcher(
            [&] { watch.wait({agent::RoundProtocol::key(f.round, "change")}, agent::Millis(0)); });
        protocol.report_success(f);
        watcher.join();
      } catch (const std::exception& e) {
        if (failures.fetch_add(1) < 5)
          std::fprintf(stderr, "rdzv_harness: node %d: %s\n", i, e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failures.load() > 0) {
    std::fprintf(stderr, "rdzv_harness: %d of %d nodes failed\n", failures.load(), nodes);
    return 1;
  }
  std::sort(formed_ms.begin(), formed_ms.end());
  std::printf("nodes %d formed_ms %.1f median_ms %.1f\n", nodes, formed_ms.back(),
              formed_ms[formed_ms.size() / 2]);
  return 0;
}
