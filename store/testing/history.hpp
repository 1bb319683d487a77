// A history of store operations as several clients observed them: what each client asked,
// what came back, and when (steady_clock) the call began and returned. check_linearizable()
// (linearizability.hpp) judges one; run_workload() (workload.hpp) records one against a live
// store, and tests write small ones by hand.
//
// One client is one connection used by one thread: its operations never overlap in time and
// the store executes them in the order they were sent. GET and MULTI_GET are what
// Client::get() and Client::multi_get() send: a WAIT on the keys, then the read.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::store::testing {

using Clock = std::chrono::steady_clock;

enum class OpKind : uint8_t {
  kSet,         // keys {k}, values {v}; no reply
  kGet,         // keys {k}; reply {value}
  kAdd,         // keys {k}, delta; number = the new value
  kCompareSet,  // keys {k}, values {expected, desired}; reply {the store's reply}
  kDeleteKey,   // keys {k}; number = 1 erased, 0 absent
  kCheck,       // keys; number = 1 all present, 0 not
  kWait,        // keys; released (kReply) or kTimedOut
  kMultiGet,    // keys; reply = one value per key
  kMultiSet,    // keys, values (one per key, set in order); no reply
  kAppend,      // keys {k}, values {data}; no reply
  kNumKeys,     // number = GETNUMKEYS's reply
  kQueuePush,   // keys {queue}, values {v}; no reply
  kQueuePop,    // keys {queue}; reply {} if the queue was empty, else {the popped value}
  kQueueLen,    // keys {queue}; number = the length
};

enum class Outcome : uint8_t {
  kReply,     // the reply arrived (WAIT, GET, MULTI_GET: after the WAIT was released)
  kNoReply,   // SET, MULTI_SET, APPEND, QUEUE_PUSH: the protocol sends none
  kTimedOut,  // WAIT, GET, MULTI_GET: the client gave up waiting and sent CANCEL_WAIT
};

struct Operation {
  int client = 0;
  OpKind kind = OpKind::kSet;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t delta = 0;
  Outcome outcome = Outcome::kReply;
  int64_t number = 0;
  std::vector<std::string> reply;
  Clock::time_point invoked;    // just before the request was sent
  Clock::time_point responded;  // just after the reply was read (for kNoReply: the send)
};

using History = std::vector<Operation>;

// True for the kinds that have no reply: they may take effect after the call returned, up to
// the reply to the same client's next operation.
bool has_no_reply(OpKind kind);
// True for the kinds whose reply waits for a WAIT's release (and that can time out).
bool waits_first(OpKind kind);
// True if the operation changes nothing in any legal execution (reads, WAIT, DELETE_KEY that
// erased nothing, a COMPARE_SET that did not store, a QUEUE_POP of an empty queue).
bool changes_nothing(const Operation& op);

const char* op_name(OpKind kind);
// One line, e.g. `c2 GET "a" -> "5" [+1.204, +1.377 ms]`, times from `origin`.
std::string describe(const Operation& op, Clock::time_point origin);
// The earliest invocation in the history (the origin describe() is usually given).
Clock::time_point history_origin(const History& history);

}  // namespace ddprun::store::testing
