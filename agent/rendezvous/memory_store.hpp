// MemoryStore: one RendezvousStore shared by the threads of one process, for tests that run N
// nodes as N threads (gloo's HashStore). The data and its rules are the TCP store's own
// (store::StoreState: ADD, COMPARE_SET, WAIT), so a protocol tested here sees the semantics it
// gets in production; only the transport differs.
//
// Usage: create one MemoryStore, then on each node's thread connect() a client bound to that
// thread's executor. kill() simulates a node dying abruptly: its will applies and its
// operations, one parked in wait() included, throw StoreError(kClosed).
//
//   MemoryStore store;
//   // on node i's thread, with its own io_context:
//   std::unique_ptr<RendezvousStore> client = store.connect(io.get_executor());
//   // on any thread:
//   store.kill(*client);
//
// Waiting parks the coroutine on a timer on the client's executor; the write that satisfies
// it cancels that timer through asio::post. No thread or polling of its own.
//
// Ownership and threads: MemoryStore and its clients share the data (a shared_ptr), so either
// may be destroyed first. The caller owns each client (unique_ptr). Every MemoryStore member
// is thread-safe. A client is used as RendezvousStore says: from the executor it was connected
// with, which must run its handlers one at a time (one thread, or a strand), one operation at
// a time. Destroying a client closes it; an operation still suspended then throws kClosed.
// Deviation from the TCP store: an ADD onto a value that is not a number (or overflows) throws
// kProtocol and leaves the client usable, where the server would drop the connection.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <memory>

#include "agent/rendezvous/rendezvous_store.hpp"

namespace ddprun::agent {

namespace detail {
struct MemoryStoreState;
}

class MemoryStore {
 public:
  MemoryStore();
  ~MemoryStore();
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  // A new client whose parked waits run on `executor`.
  std::unique_ptr<RendezvousStore> connect(boost::asio::any_io_executor executor);

  // Ends `client` as if its process died: its will applies (waking waiters) and its
  // operations, one in progress included, throw kClosed. Same effect as client.close(), but
  // callable from any thread. Returns false, doing nothing, when `client` is not a live client
  // of this store (already closed or killed, or another store's); only its address is used.
  bool kill(const RendezvousStore& client);

 private:
  std::shared_ptr<detail::MemoryStoreState> state_;
};

}  // namespace ddprun::agent
