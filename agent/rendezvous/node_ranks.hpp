// Node descriptors and the one deterministic rule that turns a closed round's members into
// node ranks and global ranks. Every agent of a round runs it on the same input (the round's
// descriptors, in join order) and gets the same answer, so no rank assignment is written to
// the store.
//
// The rule (documented in agent/rendezvous/README.md):
//   1. A node's --node-rank hint is honoured when it is in [0, n) and no node that joined
//      earlier claimed the same rank.
//   2. The other nodes take the free ranks in increasing order, sorted by their advertised
//      address in natural order ("node2" < "node10", "10.0.0.9" < "10.0.0.10"), ties broken
//      by join order.
//   Global ranks are prefix sums of the nodes' local world sizes in node-rank order.
// With `strict` (static backend) every node must give a valid, unique hint; otherwise
// assign_node_ranks throws std::invalid_argument naming the clash.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent {

// What a node tells the others when it joins a round. Stored as one line of text,
// "<nproc> <port> <hint> <addr> <id> <replica port>" (the last is optional when reading): every
// member of an N-node round reads all N, so the format is compact and quick to parse
// (addresses and ids contain no spaces).
struct NodeDesc {
  std::string id;        // unique per agent process: "<addr>:<pid>:<random>"
  std::string addr;      // advertised address (--local-addr, else the host name)
  int nproc = 1;         // local world size
  int hint = -1;         // --node-rank, -1 when not given
  int port = 0;          // the port of this node's workers' store for the round (used if rank 0)
  int replica_port = 0;  // its in-memory checkpoint replica server (0: none)
};

std::string encode(const NodeDesc& desc);
// Throws std::invalid_argument on a malformed descriptor.
NodeDesc decode_node_desc(std::string_view text);

// <0, 0, >0 like strcmp, comparing runs of digits by their numeric value.
int natural_compare(std::string_view a, std::string_view b);

struct NodeRanks {
  std::vector<int> node_rank;  // by join index
  std::vector<int> base_rank;  // RANK of the node's local rank 0, by join index
  int world_size = 0;          // sum of nproc
  int rank0_index = 0;         // join index of node rank 0
};

// `nodes` in join-index order.
NodeRanks assign_node_ranks(const std::vector<NodeDesc>& nodes, bool strict);

}  // namespace ddprun::agent
