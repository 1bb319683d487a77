// A linearizability checker for store histories: could one store, executing the operations
// one at a time with the semantics of PROTOCOL.md (StoreModel), have produced every reply the
// clients saw, with each operation taking effect at one moment between its call and its
// return? Used to test that anything placed between clients and the store (a proxy that
// coalesces requests) is indistinguishable from the store itself.
//
// The search is Wing & Gong's, with Lowe's memoization: depth-first over the next operation
// to linearize, remembering each (operations linearized, model state) already found to be a
// dead end. Operations of one client are linearized in their program order, so "operations
// linearized" is one counter per client. The history is never split by key: multi-key ops
// (CHECK, WAIT, MULTI_GET, MULTI_SET) and GETNUMKEYS make per-key partitioning unsound.
//
// What is checked, for every operation that got a reply: the reply equals what the model
// gives at the operation's linearization point, and that point lies within [invoked,
// responded], after every operation of its own client sent before it. In detail:
// - SET, MULTI_SET (atomically, in order), APPEND, QUEUE_PUSH have no reply: they take effect
//   at one point after `invoked` and before the reply to the same client's next operation
//   (the store executes one connection's requests in order); with no later reply, at any
//   point after `invoked`.
// - ADD: the reply is the new value (a missing key counts as 0; text parsed like stoll).
//   COMPARE_SET: its four cases. DELETE_KEY: 1 if the key existed; wakes no waiter.
//   CHECK: every key in the map or a non-empty queue. GETNUMKEYS: keys in the map.
//   QUEUE_POP: the head of the queue or empty; QUEUE_LEN: its length.
// - A released WAIT is two events, both within its interval and in this order: its start,
//   which notes the keys missing then (not in the map, no non-empty queue), and its release,
//   which is legal only once each of those keys has been written since (SET, ADD, APPEND,
//   MULTI_SET, a COMPARE_SET that stored; a QUEUE_PUSH counts for only the earliest-parked
//   waiter that it completes, as the store wakes one waiter per item). DELETE_KEY writes
//   nothing.
// - GET and MULTI_GET are Client::get()/multi_get(): a WAIT on the keys (start, release) and
//   then the read, three events in order within the interval. The read returns the value, or
//   empty for a key deleted after the release.
// What is not checked:
// - A WAIT, GET or MULTI_GET that timed out constrains nothing (the client cancelled it; its
//   release may or may not have raced the cancel). It still ends earlier no-reply operations.
// - Failures (a closed connection, a protocol error) are not histories: the workload driver
//   throws instead. LIST_KEYS, BARRIER, the wills and keep-alive are not modelled.
// - At most 64 distinct key names; keys start absent and queues empty.
//
// Cost: exponential in the worst case, in practice linear for linearizable histories with a
// few concurrent clients. CheckOptions::max_states bounds the search; past it the verdict
// is kGaveUp, never a guess.
#pragma once

#include <cstddef>
#include <string>

#include "store/testing/history.hpp"

namespace ddprun::store::testing {

struct CheckOptions {
  size_t max_states = 2'000'000;  // distinct (progress, state) pairs before giving up
  // On failure, look for a smaller history that still fails by dropping operations that
  // change nothing (reads, WAITs, failed COMPARE_SETs...), which keeps it a proof: removing
  // them from a linearizable history leaves a linearizable one. At most this many re-checks.
  size_t shrink_checks = 200;
};

struct CheckResult {
  enum class Verdict { kLinearizable, kNotLinearizable, kGaveUp };
  Verdict verdict = Verdict::kLinearizable;
  // Empty when linearizable; else one paragraph: where the search got stuck, the store's
  // state there, the operations that could not come next, and the smallest failing
  // sub-history found.
  std::string explanation;
  size_t states = 0;  // distinct states the (first, full) search visited
  bool ok() const { return verdict == Verdict::kLinearizable; }
};

// Throws std::invalid_argument for a malformed history: a client's operations overlapping in
// time, a response before its invocation, missing arguments, more than 64 key names.
CheckResult check_linearizable(const History& history, const CheckOptions& options = {});

}  // namespace ddprun::store::testing
