// RendezvousHandler: how the agents of a job agree on membership and ranks for each attempt,
// and where the workers find their store (after torchelastic's RendezvousHandler). The agent
// loop only talks to this interface; single-node backends live in local_rendezvous.hpp, the
// multi-node c10d backend plugs in here later.
//
// Threads: every method is called on the agent's io_context thread; next_rendezvous() may
// suspend (a multi-node round waits for peers) but never blocks the thread.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

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
};

// A rendezvous that cannot complete (e.g. the store's port is taken): the job fails with
// this message.
class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;

  virtual std::string_view backend() const = 0;   // "static", "c10d", ...
  virtual const std::string& run_id() const = 0;  // TORCHELASTIC_RUN_ID

  // Joins the next round for attempt `restart_count` of a node running `local_world_size`
  // workers. The workers of every attempt get a store with fresh state: torch 2.x workers
  // expect a new store per attempt, torch 1.13 workers prefix keys with /worker/attempt_<N>.
  // Throws RendezvousError.
  virtual boost::asio::awaitable<RendezvousInfo> next_rendezvous(int restart_count,
                                                                 int local_world_size) = 0;

  // Nodes waiting to join the job. A positive number makes the agent restart the group
  // without spending a restart (torchelastic's scale-up). Always 0 on a single node.
  virtual int num_nodes_waiting() const { return 0; }

  // Registers a callback the handler invokes (on the io_context) when the membership
  // changes while workers run, e.g. a node joined or died. Single-node handlers never call it.
  virtual void on_membership_change(std::function<void()> callback) { (void)callback; }

  // The job is over (the workers are reaped). Multi-node backends wait for the other nodes
  // here (exit barrier) so the store's host does not leave first; then the store is closed.
  virtual boost::asio::awaitable<void> shutdown(bool succeeded) = 0;
};

}  // namespace ddprun::agent
