// RoundProtocol: the multi-node rendezvous itself, as coroutines over a RendezvousStore (see
// agent/rendezvous/README.md, "Multi-node rendezvous": the keys and rules). StoreRendezvous runs
// it on the agent's io_context over the c10d store; tests run N of them as N threads over a
// MemoryStore; the benchmark harness drives many over a real store.
//
// All keys are relative to the job's prefix (PrefixStore). Per round R ("r/R/..."):
//   join        ADD counter: a joiner's index is the value it gets, minus one
//   node/<i>    the joiner's NodeDesc (one line)    id/<agent id>  its presence
//   closed      {"n":members,"restarts":count} set once by COMPARE_SET; first closer wins
//   members     the N members' descriptors, one per line, written by the winning closer
//   change      why the round ended, set once by COMPARE_SET (first event wins):
//               "join:<id>" a node waits to join, "dead:<id>" a node's connection closed (its
//               last will), "fail:<id>" a node's worker failed, "done" every node succeeded
//   ok          ADD counter of nodes whose workers all exited 0 (the exit barrier)
//   bye/<id>    a node left after the job ended (the store's host leaves last)
// With --in-process-recovery (the workers' process group rebuilt in place, by generation g):
//   gen/<g>/ready  ADD counter of nodes whose workers all run a TrainingLoop of generation g
//   gen/<g>        "<restart count> <agent id>": who began generation g (g >= 1), set once by
//                  COMPARE_SET; every node's generation watcher waits on the next one
//   inplace        ADD counter of the round's recoveries in place: each spent a restart, which
//                  the next round's restart count includes
// Job-wide: "round" (the round newcomers look at), "max_restarts" (the first node's
// --max-restarts: one budget for the job), "closed" (the job is over: late agents leave).
//
// Threads: the executor of its store client, one call at a time; it owns no thread.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "agent/rendezvous/node_ranks.hpp"
#include "agent/rendezvous/rendezvous_store.hpp"
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
  bool hang = false;    // kFail: a hung worker ("hang:<id>"; "fail:<id>" for any other failure)
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
  template <typename T>
  using awaitable = boost::asio::awaitable<T>;

  // `store` (already under the job's prefix) and `settings` must outlive this object.
  RoundProtocol(RendezvousStore& store, const RendezvousSettings& settings, NodeDesc self);

  // Joins rounds until this node is a member of a closed round. `previous`/`change`: the
  // round this node was a member of and how it ended (none on the first join). A node that
  // arrives while a round runs waits as a spare (and asks the round to end if it has room).
  // Throws RendezvousFailed, JobClosed, store::StoreError.
  awaitable<FormedRound> join(std::optional<FormedRound> previous,
                              std::optional<RoundChange> change);

  // This node's descriptor for the next join (its workers' store port changes per round).
  void set_self(NodeDesc self);

  // The job-wide restart budget (known after the first join).
  int max_restarts() const { return max_restarts_; }

  // Ends round `round` with `value` unless another event ended it first; returns the winner.
  awaitable<RoundChange> end_round(int round, std::string value);
  // This node's workers all exited 0. Returns true if it was the last such node (the round
  // is then "done" and the job closed).
  awaitable<bool> report_success(FormedRound formed);
  // Marks the job over ("done" or "failed: ...") so late agents leave.
  awaitable<void> close_job(std::string why);
  // After the job ended: says goodbye, and for the store's host, waits (bounded) for the
  // others' goodbyes.
  awaitable<void> say_bye(FormedRound formed);
  awaitable<void> wait_byes(FormedRound formed, Millis timeout);

  static std::string key(int round, std::string_view name);
  static std::string node_key(int round, int index);

 private:
  struct Closed {
    int n = 0;  // 0: the round broke before it started
    int restarts = 0;
    bool won = false;  // this node's close_round() wrote the record: it writes "members"
  };
  struct Attempt {  // the result of trying one round
    std::optional<FormedRound> formed;
    Closed closed;
  };
  struct LastEnd {  // how the round before the one being joined ended
    int round = -1;
    int restarts = 0;
    RoundChange change;
  };
  awaitable<int> first_round();
  awaitable<Attempt> try_round(int round, std::vector<std::string> expected);
  awaitable<Closed> await_close(int round, int index, std::vector<std::string> expected);
  awaitable<std::optional<std::string>> read_members(int round, const Closed& closed);
  FormedRound make_formed(int round, int index, const Closed& closed, std::string_view members);
  awaitable<void> wait_as_spare(int round, const Closed& closed);
  awaitable<Closed> close_round(int round);
  awaitable<int> restarts_for(int round);
  awaitable<Closed> read_closed(int round, Millis timeout);
  static Closed parse_closed(const std::string& text);
  awaitable<void> check_job_open();
  awaitable<void> min_not_reached(int round);

  RendezvousStore& store_;
  const RendezvousSettings& s_;
  NodeDesc self_;
  std::string self_text_;
  int max_restarts_ = 0;
  std::chrono::steady_clock::time_point join_deadline_;
  std::optional<LastEnd> last_end_;
};

}  // namespace ddprun::agent
