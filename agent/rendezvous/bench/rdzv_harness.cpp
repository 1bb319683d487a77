// rdzv_harness: the rendezvous alone, driven N-fold in one process — N simulated nodes as N
// coroutines on one io_context, every one doing what an agent's StoreRendezvous does (two
// connections with keep-alive, the RoundProtocol join, the watcher's WAIT on the round's
// change key), without spawning workers. Used by tests/bench/rdzv for node counts where
// starting N real agents on one machine would measure the machine, not the rendezvous.
//
//   rdzv_harness --nodes N --endpoint HOST:PORT [--run-id ID] [--min N] [--last-call S]
//                [--etcd]
//
// --etcd: the endpoint is an etcd member list (as --rdzv-backend=etcd takes it), and every node
// has two EtcdStore clients instead of two ddprun store connections.
//
// Prints one line: "nodes N formed_ms T median_ms M" where T is the time from the start
// until the last node has its rank (connections included), then makes the job finish
// (every node reports success) and exits 0; exits 1 with a message on any error.
#include <sys/resource.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "agent/rendezvous/c10d_store.hpp"
#include "agent/rendezvous/etcd_store.hpp"
#include "agent/rendezvous/prefix_store.hpp"
#include "agent/rendezvous/round_protocol.hpp"

using namespace ddprun;
using Clock = std::chrono::steady_clock;
namespace asio = boost::asio;

namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "rdzv_harness: %s\nusage: rdzv_harness --nodes N --endpoint HOST:PORT "
               "[--run-id ID] [--min N] [--last-call SECONDS]\n",
               why);
  std::exit(2);
}

struct Run {
  const agent::RendezvousSettings& s;
  std::string host;
  uint16_t port;
  std::string etcd;  // member list, or empty: a ddprun store
  Clock::time_point start;
  std::vector<double> formed_ms;
  int failures = 0;
  bool etcd_watcher_next = false;  // open_store alternates: main, watcher
  asio::io_context* io = nullptr;  // stopped at the first failure: the others would wait on
};

asio::awaitable<std::unique_ptr<agent::RendezvousStore>> open_store(Run& run) {
  const std::string prefix = "/ddprun/" + run.s.run_id + "/";
  if (!run.etcd.empty()) {
    agent::EtcdStoreOptions eo;
    eo.client.endpoints = etcd::parse_endpoints(run.etcd);
    eo.job_prefix = prefix;
    eo.op_timeout = std::chrono::seconds(120);
    eo.apply_wills = !run.etcd_watcher_next;  // the main client of each node, as the agent
    run.etcd_watcher_next = !run.etcd_watcher_next;
    auto store = std::make_unique<agent::EtcdStore>(co_await asio::this_coro::executor, eo);
    std::vector<std::string> probe{prefix + "round"};
    co_await store->check(std::move(probe));  // as the agent does before it joins
    co_return std::make_unique<agent::PrefixStore>(std::move(store), prefix);
  }
  store::ClientOptions o;
  o.connect_timeout = std::chrono::seconds(60);
  o.timeout = std::chrono::seconds(120);
  auto ex = co_await asio::this_coro::executor;
  auto client = co_await store::AsyncClient::connect(ex, run.host, run.port, o);
  co_await client->keep_alive(run.s.keep_alive_interval, run.s.keep_alive_max_attempt);
  co_return std::make_unique<agent::PrefixStore>(
      std::make_unique<agent::C10dStore>(std::move(client)), "/ddprun/" + run.s.run_id + "/");
}

// What the agent's round watcher does for the running round.
asio::awaitable<void> watch(agent::RendezvousStore& store, int round) {
  std::vector<std::string> keys{agent::RoundProtocol::key(round, "change")};
  co_await store.wait(std::move(keys), agent::Millis(0));
}

asio::awaitable<void> node(Run& run, int i) {
  try {
    auto main = co_await open_store(run);
    auto watcher = co_await open_store(run);
    agent::NodeDesc self;
    self.addr = "10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
    self.id = self.addr + ":" + std::to_string(i) + ":bench";
    self.port = 20000 + i;
    agent::RoundProtocol protocol(*main, run.s, self);
    agent::FormedRound f = co_await protocol.join(std::nullopt, std::nullopt);
    run.formed_ms[static_cast<size_t>(i)] =
        std::chrono::duration<double, std::milli>(Clock::now() - run.start).count();
    asio::co_spawn(co_await asio::this_coro::executor, watch(*watcher, f.round), asio::detached);
    co_await protocol.report_success(f);
    std::vector<std::string> done{agent::RoundProtocol::key(f.round, "change")};
    co_await main->wait(std::move(done), agent::Millis(0));
    watcher->close();
  } catch (const std::exception& e) {
    if (run.failures++ < 5) std::fprintf(stderr, "rdzv_harness: node %d: %s\n", i, e.what());
    run.io->stop();  // the job cannot finish without this node
  }
}

// The harness's command line.
struct Flags {
  int nodes = 0, min_nodes = 0;
  double last_call = 30;
  std::string host, run_id = "bench";
  int port = 0;
  std::string etcd_endpoints;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  std::vector<std::string> args;
  bool use_etcd = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--etcd") == 0) {
      use_etcd = true;  // the one flag without a value
    } else {
      args.emplace_back(argv[i]);
    }
  }
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    const std::string& flag = args[i];
    const std::string& value = args[i + 1];
    if (flag == "--endpoint" && use_etcd) {
      f.etcd_endpoints = value;
      f.host = value;
    } else if (flag == "--nodes") {
      f.nodes = std::stoi(value);
    } else if (flag == "--min") {
      f.min_nodes = std::stoi(value);
    } else if (flag == "--last-call") {
      f.last_call = std::stod(value);
    } else if (flag == "--run-id") {
      f.run_id = value;
    } else if (flag == "--endpoint" && !use_etcd) {
      auto colon = value.rfind(':');
      if (colon == std::string::npos) usage("--endpoint needs HOST:PORT");
      f.host = value.substr(0, colon);
      f.port = std::stoi(value.substr(colon + 1));
    } else {
      usage(("unknown flag " + flag).c_str());
    }
  }
  if (f.nodes < 1 || f.host.empty()) usage("--nodes and --endpoint are required");
  if (f.min_nodes < 1) f.min_nodes = f.nodes;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = parse_flags(argc, argv);
  const int nodes = f.nodes;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);

  agent::RendezvousSettings s;
  s.run_id = f.run_id;
  s.min_nodes = f.min_nodes;
  s.max_nodes = nodes;
  s.last_call_timeout = agent::Millis(static_cast<long long>(f.last_call * 1000));
  s.join_timeout = std::chrono::seconds(120);
  s.read_timeout = std::chrono::seconds(120);

  asio::io_context io(1);
  Run run{s,
          f.host,
          static_cast<uint16_t>(f.port),
          f.etcd_endpoints,
          Clock::now(),
          std::vector<double>(static_cast<size_t>(nodes), -1)};
  run.io = &io;
  for (int i = 0; i < nodes; ++i) asio::co_spawn(io, node(run, i), asio::detached);
  io.run();
  if (run.failures > 0) {
    std::fprintf(stderr, "rdzv_harness: %d of %d nodes failed\n", run.failures, nodes);
    return 1;
  }
  std::sort(run.formed_ms.begin(), run.formed_ms.end());
  std::printf("nodes %d formed_ms %.1f median_ms %.1f\n", nodes, run.formed_ms.back(),
              run.formed_ms[run.formed_ms.size() / 2]);
  return 0;
}
