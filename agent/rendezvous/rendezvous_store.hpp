// RendezvousStore: the handful of operations the multi-node rendezvous (RoundProtocol) needs
// from a store that every node of a job reaches. Implementations:
//   * C10dStore (c10d_store.hpp): ddprun's TCPStore over store::AsyncClient, on the agent's
//     io_context (a ddpstore, or the store an agent hosts);
//   * MemoryStore (memory_store.hpp): in one process, for tests that run N nodes as N threads;
//   * EtcdStore (etcd_store.hpp): etcd's v3 API, for --rdzv-backend=etcd (see its header for
//     how each operation and the last will map onto etcd).
// PrefixStore (prefix_store.hpp) puts every key of a job under one prefix by wrapping.
//
// Semantics every implementation keeps:
//   * Values are byte strings; a key is absent until written. add() treats an absent key as 0
//     and stores the sum as decimal text. compare_set(k, expected, desired) writes `desired`
//     when the current value is `expected` (an absent key matches ""), and returns the value
//     stored afterwards.
//   * wait() returns true once every key exists, false when `timeout` passed first (the
//     client stays usable); a non-positive timeout waits without a deadline.
//   * set_will(key, expected, desired) is this client's last will: when the client ends for
//     any reason (closed, its process killed, its host gone past the keep-alive time), the
//     store applies compare_set(key, expected, desired) and wakes the waiters. An empty key
//     clears the will; a new will replaces the previous one. Liveness (how soon a vanished
//     client counts as ended) is the implementation's, set when it is created.
//   * Errors: store::StoreError. kTimeout: one call passed its deadline; kClosed: the store or
//     the connection is gone (close() was called, the peer died); kProtocol/kConnect as named.
//
// Threads: one client is used from one executor (the coroutine's), one operation at a time;
// close() may be called on that executor while an operation is suspended, which then throws
// kClosed.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::agent {

class RendezvousStore {
 public:
  using Millis = std::chrono::milliseconds;
  template <typename T>
  using awaitable = boost::asio::awaitable<T>;

  virtual ~RendezvousStore() = default;

  virtual awaitable<int64_t> add(std::string key, int64_t delta) = 0;
  virtual awaitable<std::string> compare_set(std::string key, std::string expected,
                                             std::string desired) = 0;
  // Whether every key exists (no waiting).
  virtual awaitable<bool> check(std::vector<std::string> keys) = 0;
  virtual awaitable<bool> wait(std::vector<std::string> keys, Millis timeout) = 0;
  // The values of keys that exist (an absent key reads as "": wait first).
  virtual awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys) = 0;
  virtual awaitable<void> multi_set(std::vector<std::pair<std::string, std::string>> kvs) = 0;
  virtual awaitable<void> set_will(std::string key, std::string expected, std::string desired) = 0;
  // Ends the client (its will applies); an operation in progress throws kClosed.
  virtual void close() = 0;

  // Conveniences on top of the operations above.
  awaitable<void> set(std::string key, std::string value);
  // Waits up to `timeout` for the key, then reads it; throws StoreError(kTimeout) naming it.
  awaitable<std::string> get(std::string key, Millis timeout);
};

}  // namespace ddprun::agent
