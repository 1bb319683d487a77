// torch_store_host: LibTorch's own TCPStore server (c10d::TCPStore with isServer=true), the
// peer ddpstore is benchmarked against. Prints "listening on 127.0.0.1:PORT", serves until
// SIGTERM/SIGINT.
//
//   torch_store_host [--port P]     (P = 0 picks a free port)
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

int main(int argc, char** argv) {
  c10d::TCPStoreOptions opts;
  opts.port = 0;
  if (argc == 3 && std::string(argv[1]) == "--port") opts.port = std::atoi(argv[2]);
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.timeout = std::chrono::seconds(300);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before the daemon thread starts
  c10d::TCPStore store("127.0.0.1", opts);
  std::printf("listening on 127.0.0.1:%u\n", static_cast<unsigned>(store.getPort()));
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  return 0;
}
