// store_proxy_host: many store proxies in one process, standing in for the agents of many
// nodes in the store benchmark (tests/bench/store). Each proxy is a StoreProxy (store/proxy.hpp)
// with its own upstream connection, as each node's agent would have.
//
//   store_proxy_host --upstream HOST:PORT --proxies N --ports-file F [--threads T]
//                    [--gather-us U]   (ProxyOptions::gather)
//
// Writes the N ports to F (one per line), then prints "ready" and serves until SIGTERM/SIGINT;
// then prints "result clients=... client_requests=... upstream_requests=... coalesced=..."
// (all proxies together) and exits.
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "store/proxy.hpp"

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "store_proxy_host: %s\n", why.c_str());
  std::exit(2);
}

struct Args {
  std::string upstream_host;
  uint16_t upstream_port = 0;
  std::string ports_file;
  size_t proxies = 0, threads = 1;
  long gather_us = -1;  // ProxyOptions' default
};

Args parse_args(int argc, char** argv) {
  Args a;
  std::string upstream;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--upstream") {
      upstream = value;
    } else if (flag == "--proxies") {
      a.proxies = std::stoul(value);
    } else if (flag == "--ports-file") {
      a.ports_file = value;
    } else if (flag == "--gather-us") {
      a.gather_us = std::stol(value);
    } else if (flag == "--threads") {
      a.threads = std::max<size_t>(1, std::stoul(value));
    } else {
      usage("unknown option " + flag);
    }
  }
  const size_t colon = upstream.rfind(':');
  if (colon == std::string::npos || a.proxies == 0 || a.ports_file.empty()) {
    usage("--upstream HOST:PORT, --proxies N and --ports-file F are required");
  }
  a.upstream_host = upstream.substr(0, colon);
  a.upstream_port = static_cast<uint16_t>(std::stoi(upstream.substr(colon + 1)));
  return a;
}

// Every proxy's counters added up; the proxies are destroyed, each on its own thread.
ddprun::store::ProxyStats close_all(std::vector<std::unique_ptr<boost::asio::io_context>>& ios,
                                    std::vector<std::unique_ptr<ddprun::store::StoreProxy>>& all) {
  ddprun::store::ProxyStats sum;
  const size_t threads = ios.size();
  for (size_t t = 0; t < threads; ++t) {
    std::promise<void> done;
    boost::asio::post(*ios[t], [&] {
      for (size_t i = t; i < all.size(); i += threads) {
        const ddprun::store::ProxyStats s = all[i]->stats();
        sum.clients += s.clients;
        sum.client_requests += s.client_requests;
        sum.upstream_requests += s.upstream_requests;
        sum.coalesced += s.coalesced;
        all[i].reset();
      }
      done.set_value();
    });
    done.get_future().wait();
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ddprun::store;
  const Args args = parse_args(argc, argv);
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // every thread inherits it; sigwait below

  std::vector<std::unique_ptr<boost::asio::io_context>> ios;
  std::vector<std::unique_ptr<StoreProxy>> all;
  for (size_t t = 0; t < args.threads; ++t)
    ios.push_back(std::make_unique<boost::asio::io_context>(1));
  ProxyOptions po;
  po.upstream_host = args.upstream_host;
  po.upstream_port = args.upstream_port;
  if (args.gather_us >= 0) po.gather = std::chrono::microseconds(args.gather_us);
  std::ofstream out(args.ports_file);
  for (size_t i = 0; i < args.proxies; ++i) {
    all.push_back(std::make_unique<StoreProxy>(*ios[i % args.threads], po));
    out << all.back()->port() << "\n";
  }
  out.close();
  std::vector<std::thread> runners;
  std::vector<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guards;
  for (auto& io : ios) {
    guards.emplace_back(io->get_executor());
    runners.emplace_back([&io] { io->run(); });
  }
  std::printf("ready\n");
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  const ProxyStats sum = close_all(ios, all);
  for (auto& g : guards) g.reset();
  for (auto& io : ios) io->stop();
  for (auto& r : runners) r.join();
  std::printf("result clients=%llu client_requests=%llu upstream_requests=%llu coalesced=%llu\n",
              static_cast<unsigned long long>(sum.clients),
              static_cast<unsigned long long>(sum.client_requests),
              static_cast<unsigned long long>(sum.upstream_requests),
              static_cast<unsigned long long>(sum.coalesced));
  return 0;
}
