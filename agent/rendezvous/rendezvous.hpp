// RendezvousHandler: how the agents of a job agree on membership and ranks for each round,
// where the workers find their store, and how a round ends for every node at once (after
// torchelastic's RendezvousHandler). The agent loop only talks to this interface; single-node
// backends live in local_rendezvous.hpp, the multi-node one (c10d and static over our store)
// in store_rendezvous.hpp.
//
// Threads: every method is called on the agent's io_context thread; the awaitables may
// suspend (a multi-node round waits for peers) but never block the thread.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent {

// The result of one rendezvous round: this node's place in the job.
struct RendezvousInfo {
  int round = 0;                // rendezvous round (0, 1, ... for multi-node; = attempt locally)
  int group_rank = 0;           // this node's rank (GROUP_RANK)
  int group_world_size = 1;     // nodes in the job (GROUP_WORLD_SIZE)
  int base_global_rank = 0;     // RANK of this node's local rank 0
  int world_size = 0;           // workers in the whole job (WORLD_SIZE)
  std::string master_addr;      // MASTER_ADDR given to the workers
  int master_port = 0;          // MASTER_PORT: the store the workers use for this attempt
  bool use_agent_store = true;  // TORCHELASTIC_USE_AGENT_STORE
  std::string store_host;       // where that store listens, as a person should read it
  int store_port = 0;
  // TORCHELASTIC_RESTART_COUNT and the job's restart budget (TORCHELASTIC_MAX_RESTARTS). The
  // handler owns both: it counts restarts (multi-node: in the store, the same on every node)
  // and answers whether another is allowed; the agent only reads them.
  int restart_count = 0;
  int max_restarts = 0;
  // The round's nodes by node rank: the address each advertised (one node: this host's name).
  std::vector<std::string> members;
  // By node rank: the port of each node's in-memory checkpoint replica server (0: none; empty
  // for one node).
  std::vector<int> replica_ports;
};

// Why a round ended, as every node of the job sees it: the first event wins.
struct RoundEnd {
  enum class Kind {
    kSucceeded,     // every node's workers exited 0
    kWorkerFailed,  // a worker failed (here, or on another node): spends a restart
    kNodeJoined,    // a node waits to join: re-form without spending a restart
    kNodeLost,      // a node died or left: re-form without it, no restart spent
    kStoreLost,     // the rendezvous store is gone: stop, exit non-zero
  };
  Kind kind = Kind::kSucceeded;
  std::string what;  // for the log: "node 2 (10.0.0.3) lost its connection to the store"
  // kWorkerFailed: whether the job's restart budget allows one more restart (the handler's
  // answer; the next round then carries restart_count + 1).
  bool restart_allowed = false;
  // kWorkerFailed: the failure was a hang, whose evidence every node adds before it stops
  // its workers (exchange_hang_evidence).
  bool hang = false;
};

// The one restart rule, for every handler: a job that has used `restarts_used` of its
// `max_restarts` may restart once more while it has used fewer.
inline bool may_restart(int restarts_used, int max_restarts) {
  return restarts_used < max_restarts;
}

// A rendezvous that cannot complete (e.g. the store's port is taken, the endpoint is
// unreachable, too few nodes joined): the job ends with this message and exit code (0 for a
// late node finding the job already finished).
class RendezvousError : public std::runtime_error {
 public:
  explicit RendezvousError(const std::string& what, int exit_code = 1)
      : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;

  virtual const std::string& run_id() const = 0;  // TORCHELASTIC_RUN_ID

  // Joins the next round for a node running `local_world_size` workers. The workers of every round
  // get a store with fresh state: torch 2.x workers expect a new store per attempt, torch 1.13
  // workers prefix keys with /worker/attempt_<N>. Throws RendezvousError.
  virtual boost::asio::awaitable<RendezvousInfo> next_rendezvous(int local_world_size) = 0;

  // The event that ended the running round, once another node (or the store) ended it;
  // nullopt while it runs. Single node: always nullopt.
  virtual std::optional<RoundEnd> round_end() const { return std::nullopt; }
  // `callback` runs on the io_context whenever round_end() becomes set.
  virtual void on_round_end(std::function<void()> callback) { (void)callback; }

  // This node's workers failed (`hang`: one hung): ends the round for every node. Returns what
  // ended it (another node's event may have come first) and, for a failure, whether a restart
  // is left.
  virtual boost::asio::awaitable<RoundEnd> report_failure(bool hang) = 0;
  // In-process recovery (agent/in_process_recovery.hpp): a failed worker is started again
  // while the others run, in the same round, and every worker of the round rebuilds its
  // process group to the next *generation*. Across nodes the handler is how the nodes agree:
  // which generation runs everywhere, who begins the next one, and the restart it spends.
  struct InPlaceRestart {
    std::optional<int> restart_count;  // granted: the job's restart count after this one
    std::string refused;  // not granted: why (empty: no restart left, the failure path says so)
  };
  // This node's failed workers are to be replaced while every other worker runs a TrainingLoop
  // of `generation`: spends one restart of the job's budget and, across nodes, announces
  // generation + 1 to the others. Refused when no restart is left, when another node's
  // workers do not all run that generation, or when another node began one at the same time.
  virtual boost::asio::awaitable<InPlaceRestart> restart_in_place(int generation) = 0;
  // Across nodes: every worker of this node runs a TrainingLoop of `generation` (`joined`),
  // or no longer does (after it did). The agent says each change once.
  virtual boost::asio::awaitable<void> share_generation(int generation, bool joined) {
    (void)generation, (void)joined;
    co_return;
  }
  // Whether every node's workers run `generation` (one node: true, the agent knows its own).
  virtual boost::asio::awaitable<bool> generation_formed(int generation) {
    (void)generation;
    co_return true;
  }
  // Another node began generation `generation` (its workers are being replaced): `callback`
  // runs on the io_context with it, the job's restart count after that recovery, and who.
  struct PeerRecovery {
    int generation = 0;
    int restart_count = 0;
    std::string who;  // "node 1 (10.0.0.2)"
  };
  virtual void on_peer_recovery(std::function<void(const PeerRecovery&)> callback) {
    (void)callback;
  }
  // A hang's evidence (agent/hang/collective_judge.hpp), shared by the nodes of the running
  // round: publishes this node's `mine`, then returns every node's part that arrived within
  // `timeout`, this node's included, by node rank. One node: `mine` alone, at once.
  virtual boost::asio::awaitable<std::vector<std::string>> exchange_hang_evidence(
      std::string mine, std::chrono::milliseconds timeout) {
    (void)timeout;
    co_return std::vector<std::string>{std::move(mine)};
  }
  // This node's workers all exited 0: the exit barrier. Returns kSucceeded once every node's
  // workers have (or after the exit barrier's timeout), else the event that ended the round
  // first; the node then re-forms with the others.
  virtual boost::asio::awaitable<RoundEnd> report_success() {
    co_return RoundEnd{RoundEnd::Kind::kSucceeded, {}, false};
  }

  // This node serves replicas of in-memory checkpoints on `port` (agent/checkpoint_replicas.hpp):
  // advertised to the other nodes from the next join on. Single node: nothing to do.
  virtual void set_replica_port(int port) { (void)port; }
  // Whether the job may have more than one node (then the replicas are worth serving).
  virtual bool spans_nodes() const { return false; }

  // A signal arrived: abandon blocking waits (next_rendezvous throws, report_success returns).
  virtual void interrupt() {}

  enum class Exit {
    kSucceeded,  // the job succeeded
    kFailed,     // the job failed (no restarts left): close the rendezvous
    kLeaving,    // this node leaves (a signal, an error): the others go on without it
  };
  // The workers are reaped. Multi-node: the store's host waits (bounded) for the others to
  // leave first; then every connection and store of this agent is closed.
  virtual boost::asio::awaitable<void> shutdown(Exit how) = 0;
};

}  // namespace ddprun::agent
