// A randomized, seeded workload for linearizability tests: `clients` threads, each with its
// own Client connection to the store at host:port (our Server, or anything that speaks its
// protocol in between), doing `ops_per_client` random operations over a few keys and queues,
// recorded as a History for check_linearizable().
//
// The mix touches every modelled operation: SET, GET (WAIT + GET, with a 50-200 ms WAIT that
// sometimes times out), ADD with deltas -2..3 (0 included), COMPARE_SET expecting a value the
// client saw recently (so some succeed), an absent key or a number, DELETE_KEY, CHECK and WAIT
// over one to three names, MULTI_GET, MULTI_SET, APPEND of a digit, GETNUMKEYS, QUEUE_PUSH/
// POP/LEN. Every stored value stays a decimal number, so ADD never meets text it cannot
// parse. One queue name is also a key, so CHECK and WAIT see both.
//
// Client::multi_get() waits for its keys with the call deadline, so each client sends its
// MULTI_GETs over a second connection whose deadline is max_wait, replaced after a timeout.
// Those connections appear in the history as clients of their own, numbered from `clients`
// up; clients 0..clients-1 are the main connections.
//
// Which operations a thread draws depends only on the seed and its client id; how they
// interleave depends on the scheduler, so a seed names a workload, not a history.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "store/client.hpp"
#include "store/testing/history.hpp"

namespace ddprun::store::testing {

struct WorkloadOptions {
  uint64_t seed = 1;
  int clients = 4;
  int ops_per_client = 40;  // recorded operations per thread, its MULTI_GETs included
  std::vector<std::string> keys{"a", "b", "c"};
  std::vector<std::string> queues{"q", "c"};
  std::chrono::milliseconds min_wait{50};  // WAIT/GET timeouts are drawn from this range
  std::chrono::milliseconds max_wait{200};
  // Deadlines for connecting and for every call but MULTI_GET (see above); the token.
  ClientOptions client = [] {
    ClientOptions o;
    o.connect_timeout = std::chrono::seconds(10);
    o.timeout = std::chrono::seconds(10);
    return o;
  }();
};

// Connects every client, starts them together and returns their operations once all are
// done. A WAIT or GET that times out is recorded as such; any other failure (connect, a
// closed connection, a deadline) throws std::runtime_error naming the seed, the client and
// the operation. Thread-safe: each call uses its own clients.
History run_workload(const std::string& host, uint16_t port, const WorkloadOptions& options);

}  // namespace ddprun::store::testing
