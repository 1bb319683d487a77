// RoundProtocol: the multi-node rendezvous as blocking store calls (the protocol itself; see
// agent/README.md, "Multi-node rendezvous", for the keys and the rules). StoreRendezvous runs
// it on a worker thread so the agent's io_context never blocks; the rendezvous-only benchmark
// harness drives many of them, one per thread.
//
// All keys are relative to the job's prefix (PrefixClient). Per round R ("r/R/..."):
//   join        ADD counter: a joiner's index is the value it gets, minus one
//   node/<i>    the joiner's NodeDesc (JSON)       id/<agent id>  its index
//   closed      {"n":members,"restarts":count} set once by COMPARE_SET; first closer wins
//   members     the N members' descriptors, one per line, written by the winning closer
//   change      why the round ended, set once by COMPARE_SET (first event wins):
//               "join:<id>" a node waits to join, "dead:<id>" a node's connection closed (its
//               last will), "fail:<id>" a node's worker failed, "done" every node succeeded
//   ok          ADD counter of nodes whose workers all exited 0 (the exit barrier)
//   bye/<id>    a node left after the job ended (the store's host leaves last)
// Job-wide: "round" (the round newcomers look at), "max_restarts" (the first node's
// --max-restarts: one budget for the job), "closed" (the job is over: late agents leave).
//
// Threads: one thread at a time (it owns no thread); interrupt() may come from any thread
// through the PrefixClient.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "agent/rendezvous/node_ranks.hpp"
#include "agent/rendezvous/prefix_client.hpp"
#include "agent/rendezvous/settings.hpp"

namespace ddprun::agent {

// A closed round this node is a member of.
struct FormedRound {
  int round = 0;
  int index = 0;                // this node's join index
  int restart_count = 0;        // TORCHELASTIC_RESTART_COUNT, the same on every node
  std::vector<NodeDesc> nodes;  // the members, by join index
  NodeRanks ranks;
};

// How a round ended, parsed from its "change" value.
struct RoundChange {
  enum class Kind { kJoin, kDead, kFail, kDone };
  Kind kind = Kind::kDone;
  std::string node_id;  // who joined / died / failed
  static RoundChange parse(const std::string& value);
  // Whether it spends one restart of the job's budget (only a worker failure does).
  bool spends_restart() const { return kind == Kind::kFail; }
};

// The rendezvous could not complete; what() is the message for the user.
class RendezvousFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// The job is over (finished, or failed elsewhere): this node has nothing to do.
class JobClosed : public std::runtime_error {
 public:
  JobClosed(const std::string& what, bool succeeded)
      : std::runtime_error(what), succeeded_(succeeded) {}
  bool succeeded() const { return succeeded_; }  // the job finished well

 private:
  bool succeeded_;
};

class RoundProtocol {
 public:
  // `client` must outlive this object.
  RoundProtocol(PrefixClient& client, const RendezvousSettings& settings, NodeDesc self);

  // Joins rounds until this node is a member of a closed round. `previous`/`change`: the
  // round this node was a member of and how it ended (none on the first join). A node that
  // arrives while a round runs waits as a spare (and asks the round to end if it has room).
  // Throws RendezvousFailed, JobClosed, store::StoreError.
  FormedRound join(const FormedRound* previous, const std::optional<RoundChange>& change);

  // This node's descriptor for the next join (its workers' store port changes per round).
  void set_self(NodeDesc self);

  // The job-wide restart budget (known after the first join).
  int max_restarts() const { return max_restarts_; }

  // Ends round `round` with `value` unless another event ended it first; returns the winner.
  RoundChange end_round(int round, const std::string& value);
  // This node's workers all exited 0. Returns true if it was the last such node (the round
  // is then "done" and the job closed).
  bool report_success(const FormedRound& formed);
  // Marks the job over ("done" or "failed: ...") so late agents leave.
  void close_job(const std::string& why);
  // After the job ended: says goodbye, and for the store's host, waits (bounded) for the
  // others' goodbyes.
  void say_bye(const FormedRound& formed);
  void wait_byes(const FormedRound& formed, Millis timeout);

  static std::string key(int round, const std::string& name);
  static std::string node_key(int round, int index);

 private:
  struct Closed {
    int n = 0;  // 0: the round broke before it started
    int restarts = 0;
    bool won = false;  // this node's close_round() wrote the record: it writes "members"
  };
  struct LastEnd {  // how the round before the one being joined ended
    int round = -1;
    int restarts = 0;
    RoundChange change;
  };
  std::optional<FormedRound> try_round(int round, const std::vector<std::string>& expected,
                                       Closed* closed);
  Closed close_round(int round);
  int restarts_for(int round);
  Closed read_closed(int round, Millis timeout);
  static Closed parse_closed(const std::string& text);
  void check_job_open();
  [[noreturn]] void min_not_reached(int round);

  PrefixClient& client_;
  const RendezvousSettings& s_;
  NodeDesc self_;
  std::string self_text_;
  int max_restarts_ = 0;
  std::chrono::steady_clock::time_point join_deadline_;
  std::optional<LastEnd> last_end_;
};

}  // namespace ddprun::agent
