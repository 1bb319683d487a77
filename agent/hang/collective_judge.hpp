// Which rank a collective hang waits for, and in which collective: the agent's reading of
// torch's flight recorder and of the stacks it captured (docs/hangs-health-events.md).
//
// torch 2.x keeps, per process, a ring buffer of the collectives each process group ran (the
// flight recorder: on by default since 2.11, gloo included in 2.15). A dump in its JSON form
// (`torch._C._distributed_c10d._dump_fr_trace_json()`, version "2.10") is an object with
//   "pg_status": {"<pg id>": {"last_enqueued_collective": "5", "last_completed_collective": "4",
//                             "last_started_collective": "-1"}, ...}
//   "pg_config": {"<pg name>": {"desc": ..., "ranks": "[0, 1]"}}
//   "entries":   [{"collective_seq_id": 5, "pg_id": 0, "process_group": ["0", "default_pg"],
//                  "profiling_name": "gloo:all_reduce", "input_sizes": [[6000000]],
//                  "input_dtypes": ["Float"], "time_created_ns": ..., "is_p2p": false,
//                  "retired": false, "state": "scheduled"}, ...]
// That is all this file relies on; a field missing or of another type is skipped, and a
// document without "pg_status" is no trace. torch's pickled dumps (fr_pickle.hpp) have the
// same fields, with integers where the JSON has strings of digits.
//
// The judgement, per process group: the stuck collective is the lowest sequence number some
// rank enqueued and has not completed. Ranks that enqueued it wait in it; ranks whose last
// enqueued collective is older never entered it (the culprits). Ranks with no trace (torch
// 1.13, a worker that could not answer) are placed by their stacks: waiting inside a collective,
// or elsewhere. Pure functions, bounded by their input.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/process/stack_dump.hpp"

namespace ddprun::agent {

struct TraceEntry {
  int64_t seq = 0;         // collective_seq_id, within its process group
  std::string op;          // "all_reduce" (the profiling name without its backend)
  int64_t bytes = 0;       // of its inputs
  int64_t created_ns = 0;  // unix time, ns (0: unknown)
};

struct PgTrace {
  int64_t last_enqueued = -1;
  int64_t last_completed = -1;
  std::vector<TraceEntry> entries;  // collectives only (no point-to-point), oldest first
  const TraceEntry* find(int64_t seq) const;
};

// One rank's flight recorder: process group id -> its trace.
struct RankTrace {
  std::map<std::string, PgTrace> pgs;
};

// nullopt (and why in `error`) for a text that is not a flight-recorder dump.
std::optional<RankTrace> parse_flight_recorder_json(std::string_view text, std::string* error);
// The same from torch's pickle form of the dump (fr_pickle.hpp): the same fields, with
// integers where the JSON form has strings of digits.
std::optional<RankTrace> parse_flight_recorder_pickle(std::string_view data, std::string* error);

// What the agent knows of one rank when it judges.
struct RankEvidence {
  int rank = 0;
  std::string host;
  pid_t pid = 0;
  std::optional<RankTrace> trace;
  StackPlace place;  // from its stacks (unknown when none were taken)
  // It died of a collective's own timeout: its most recent collective is the one it waited in,
  // whatever its trace says of it (torch may mark the failed one completed before it dumps).
  bool timed_out = false;
};

struct CollectiveVerdict {
  // One line for the console, the event log and the summary, e.g.
  //   collective #5 all_reduce (24.0 MB, pg 0): rank 0 waiting 3.1 s; rank 1 (host, pid 4133)
  //   never entered it (its last: #4 broadcast)
  // empty when the evidence shows no collective hang.
  std::string line;
  std::vector<int> culprits;  // ranks that never entered the stuck collective (or are elsewhere)
  std::vector<int> waiting;
  int64_t seq = -1;  // the stuck collective (-1: unknown, from stacks only)
  std::string op;
  std::string pg;
  bool from_flight_recorder = false;
};

// `world_size`: the ranks the job has (ranks without evidence are said to be on other nodes
// when `local_only`). `now_ns`: unix time, for how long the waiting ranks have waited.
CollectiveVerdict judge_collective_hang(const std::vector<RankEvidence>& ranks, int world_size,
                                        int64_t now_ns);

// The evidence of one node's ranks as one JSON text, for the other nodes (through the
// rendezvous store), and back. Each trace keeps only what a judgement reads: per group its
// status and the entries from its last completed collective on (at most kSharedEntries), so a
// part is a few hundred bytes per rank. decode_evidence skips what it cannot read.
inline constexpr size_t kSharedEntries = 32;
std::string encode_evidence(const std::vector<RankEvidence>& ranks);
std::vector<RankEvidence> decode_evidence(std::string_view text);

// "0-2,4,6-7".
std::string rank_ranges(std::vector<int> ranks);

}  // namespace ddprun::agent
