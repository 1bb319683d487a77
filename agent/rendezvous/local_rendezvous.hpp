// Single-node rendezvous: this node is the whole job (group rank 0 of 1) and the agent hosts
// the workers' c10d store in-process, on its own io_context (no extra thread).
//
// Every attempt gets a new store: with a fixed port (static backend with --master-port) the
// old server is closed and a new one bound to the same port (SO_REUSEADDR); with port 0
// (--standalone, or no --master-port) a new free port each attempt, as torchrun does. A port
// that is already taken is an error naming the port, never a silent join of another job's
// store.
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>
#include <string>

#include "agent/rendezvous/rendezvous.hpp"

namespace ddprun::store {
class Server;
}

namespace ddprun::agent {

struct LocalRendezvousOptions {
  std::string run_id = "none";
  int max_restarts = 0;                   // --max-restarts: the job's restart budget
  std::string bind_host = "0.0.0.0";      // where the store listens
  int port = 0;                           // 0: a free port per attempt
  std::string master_addr = "127.0.0.1";  // what workers get as MASTER_ADDR
};

class LocalRendezvous final : public RendezvousHandler {
 public:
  LocalRendezvous(boost::asio::io_context& io, LocalRendezvousOptions options);
  ~LocalRendezvous() override;

  const std::string& run_id() const override { return options_.run_id; }
  boost::asio::awaitable<RendezvousInfo> next_rendezvous(int local_world_size) override;
  // Counts the restart the next round will be, if the budget allows one.
  boost::asio::awaitable<RoundEnd> report_failure(bool hang) override;
  boost::asio::awaitable<InPlaceRestart> restart_in_place(int generation) override;
  boost::asio::awaitable<void> shutdown(Exit how) override;

 private:
  boost::asio::io_context& io_;
  LocalRendezvousOptions options_;
  std::unique_ptr<store::Server> server_;
  int restart_count_ = 0;      // of the round that runs (the one owner of this number)
  bool restart_next_ = false;  // the running round failed with a restart allowed
};

}  // namespace ddprun::agent
