// CheckpointReplicas: a node's in-memory checkpoints kept on a second node, so that a node
// that dies does not take the job's latest state with it.
//
// Each agent of a multi-node job with in-memory checkpoints serves them on a TCP port of its own
// (advertised in its rendezvous descriptor) and, while its workers run, pushes every checkpoint
// they save to its successor in the round (node rank + 1, wrapping). A save is noticed through
// inotify when its file is renamed into place (atomic saves only: names starting with '.' and
// temp names are skipped); the push runs in the agent's event loop, never blocking a worker, and
// sends the newest content of each name (a save that lands while an older one is on the wire is
// sent next; the ones between are skipped). A file is read under a shared flock: the Python
// module's saver writes over an earlier save's file, but only under an exclusive one
// (worker-sdk/python/ddprun/checkpoint.py), so what is sent is never half written. The successor keeps them under
// <dir>/.replicas/<node rank>/, hidden from the workers' loads.
//
// When a round forms, before its workers start, a node whose rank's state it does not hold
// (a replacement node, or one whose rank changed) gets it: its own replicas if it was that
// rank's successor, else from the peers, asking the rank's successor first. What it held as its
// previous rank's state becomes its replica of that rank, still served to the node that takes
// that rank now. A node whose rank is unchanged does nothing: a worker failure costs no traffic.
// A job's first round asks nobody.
//
// Every copy is stamped with the round it was saved in; a restore takes the newest copy there is
// (one of the last round stops the search), and a node drops the copies two rounds older than
// a push it receives.
//
// Wire protocol, one request per connection: a JSON line, then bytes.
//   {"op":"put","job":ID,"rank":R,"round":K,"name":N,"size":S}\n <S bytes>
//       ->  "OK\n" | "NO <why>\n"
//   {"op":"get","job":ID,"rank":R}\n
//       ->  {"round":K}\n ({"name":N,"size":S}\n <S bytes>)* "END\n"   (K = -1: none here)
// A request for another job id, a malformed line or one longer than 4 KiB closes the connection.
// The port trusts the network as the c10d store does: anyone who reaches it can read the job's
// checkpoints (bind ddprun to a private network).
//
// Threads: the agent's io_context.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "store/sys/fd.hpp"

namespace ddprun::agent {

// A member's replica server, by node rank (port 0: it serves none).
struct ReplicaPeer {
  std::string host;
  int port = 0;
};

class CheckpointReplicas {
 public:
  // Serves `dir` (the job's in-memory checkpoint directory) on an ephemeral port of every
  // interface. `limit`: the bytes the replicas may take besides the node's own checkpoints.
  CheckpointReplicas(boost::asio::io_context& io, std::string dir, uint64_t limit,
                     std::string job_id);
  ~CheckpointReplicas();
  CheckpointReplicas(const CheckpointReplicas&) = delete;
  CheckpointReplicas& operator=(const CheckpointReplicas&) = delete;

  int port() const { return port_; }

  // Round `round` formed and no worker runs: this node is `rank` of `peers`. Puts the state
  // of `rank` in place (see above) and pushes to the new successor from now on.
  boost::asio::awaitable<void> round_formed(int rank, int round, std::vector<ReplicaPeer> peers);

 private:
  struct Fetched {
    int round = -1;  // the round it was saved in
    size_t files = 0;
    uint64_t bytes = 0;
  };
  boost::asio::awaitable<void> accept_loop();
  boost::asio::awaitable<void> serve(boost::asio::ip::tcp::socket socket);
  // One request each: a replica pushed here, a rank's files sent back.
  boost::asio::awaitable<void> serve_put(boost::asio::ip::tcp::socket& socket,
                                         boost::asio::streambuf& buf, int rank,
                                         const std::string& name, uint64_t size, int round);
  boost::asio::awaitable<void> serve_get(boost::asio::ip::tcp::socket& socket, int rank);
  boost::asio::awaitable<void> watch_loop();
  boost::asio::awaitable<void> push_loop();
  boost::asio::awaitable<std::string> push(const std::string& name);
  // `rank`'s state as `peer` holds it, into the directory `into`.
  boost::asio::awaitable<Fetched> fetch(const ReplicaPeer& peer, int rank, const std::string& into);
  std::string files_of(int rank) const;  // the directory holding `rank`'s state here, or ""
  void wake_pusher();

  boost::asio::io_context& io_;
  std::string dir_;
  uint64_t limit_;
  std::string job_;
  boost::asio::ip::tcp::acceptor acceptor_;
  int port_ = 0;
  sys::UniqueFd inotify_;
  std::unique_ptr<boost::asio::posix::stream_descriptor> watch_;
  boost::asio::steady_timer wake_;
  std::set<std::string> dirty_;  // saved names not yet pushed
  int rank_ = -1;                // whose state the directory itself holds (-1: nobody's yet)
  int round_ = -1;               // the round that rank is of
  ReplicaPeer successor_;        // port 0: none (one node)
  int successor_rank_ = -1;
  std::string push_error_;  // the last push failure, logged once until one succeeds
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace ddprun::agent
