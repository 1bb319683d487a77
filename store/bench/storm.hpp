// The init storm: what a large job's ranks do to the store at start, all at once.
//
// Every client (one per rank) connects, handshakes (2.x dialect: VALIDATE + PING), joins
// (ADD init/ +1), publishes its address (SET addr/<rank>), waits for rank 0's and its ring
// neighbour's addresses and reads them (WAIT on both, GET, GET), then passes a barrier (ADD
// barrier +1; the one that sees the last count SETs the barrier's done key; everyone WAITs
// for it). Clients run as state machines over a few epoll loops, so the generator does not
// starve the server on a small machine; a failed client is counted, never fatal.
//
// With drops, a tenth of the clients are intruders that vanish abruptly (RST): half of them
// mid-handshake (a partial VALIDATE frame), half while parked in a WAIT that nothing will
// release. They take no rank: the others still form a whole ring and barrier.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "store/protocol.hpp"

namespace ddprun::store::bench {

struct StormOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  size_t clients = 1024;
  size_t threads = 1;
  Dialect dialect = Dialect::kTorch2;
  bool drops = false;
  std::string tag = "0";        // names this storm's barrier, so storms can repeat on one server
  double timeout_s = 120;       // the whole storm
  size_t source_addresses = 1;  // spread clients over 127.0.0.1..N (ports beyond 28k per source)
  // Through store proxies: client i of this generator connects to ports[i / per_port] (on
  // `host`) instead of `port`, as a node's ranks reach their own agent's proxy.
  std::vector<uint16_t> ports;
  size_t per_port = 8;
  // A storm spread over several generator processes: this one's ranks start at rank_offset, and
  // the job has `world` ranks in all (0: just this generator's).
  size_t rank_offset = 0;
  size_t world = 0;
};

struct StormResult {
  double seconds = 0;    // first connect to the last client's barrier release
  double connect_s = 0;  // first connect to the last connection established
  size_t ranks = 0;      // clients that take a rank
  size_t completed = 0;  // ranks that passed the barrier
  size_t failed = 0;     // ranks that failed (refused, reset, wrong reply, timeout)
  size_t resets = 0;     // of those: connection refused or reset by the server
  size_t dropped = 0;    // intruders that vanished as planned
};

StormResult run_storm(const StormOptions& options);

}  // namespace ddprun::store::bench
