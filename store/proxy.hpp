// StoreProxy: a node's store endpoint for its own workers. Workers (torch 1.13, torch 2.x, our
// clients) connect to it on loopback and speak the usual TCPStore protocol; it forwards their
// requests to the job's store over ONE multiplexed connection (PROTOCOL.md, "Multiplexed
// connections") and asks once what they ask alike:
//
//   * ADDs of one key become one ADD of their sum; each client gets the value it would have
//     got had the ADDs run one after the other (in the order they reached the proxy);
//   * GETs of one key, and WAITs on one set of keys, become one upstream GET / tagged WAIT whose
//     reply goes to each of them;
//   * everything else passes through, in order.
//
// Exactness: a request only joins a coalesced request that has not been sent upstream yet, so
// each client's answer is one the store gave after that client asked. Per key (per key set for
// WAIT) at most one coalesced request is in flight; what arrives meanwhile gathers into the next
// one, sent when the reply comes back (a client pays at most one extra round trip for it). A
// client's requests reach the store in the order it sent them: while one of them waits to be
// sent, the ones behind it wait too.
//
// What a client sees is what it would see talking to the store directly: the same replies in the
// same order, the 2.x CANCEL_WAIT rules and 1.13's "a new request cancels the pending WAIT",
// WATCH_KEY's acknowledgement, PING echoed, a last will (SET_WILL) applied upstream when its
// connection ends. The proxy takes loopback clients only and has no token of its own; it
// authenticates upstream with ClientOptions::token when the store has one.
//
// If the upstream connection breaks, the proxy connects again and resumes its session on the
// store (PROTOCOL.md, "Resuming a multiplexed connection"): clients notice nothing but the
// delay, and no request is lost or applied twice. If it cannot (the store is gone or restarted,
// or kept the session past ServerOptions::mux_resume_timeout), every client connection is
// closed, as if the store had gone, and `on_upstream_lost` is told.
//
// Threads: a StoreProxy runs on the io_context it is given; construct, use and destroy it on that
// io_context's thread. ProxyThread bundles one with its own thread.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "store/client.hpp"
#include "store/protocol.hpp"

namespace ddprun::store {

struct ProxyOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: pick a free port; StoreProxy::port() says which
  std::string upstream_host;
  uint16_t upstream_port = 0;
  ClientOptions upstream;  // connect timeout and retries, token, keep-alive of the upstream link
  Limits limits;           // per request, as the store's (checked as the frames arrive)
  // How long the proxy gathers before it sends what has arrived upstream: requests of its
  // clients that arrive within it go together (ADDs of one key as one, distinct WAITs, GETs and
  // SETs each as one request). 0: at the end of the turn (every request already read). The
  // default holds a request at most 0.2 ms, a few percent of a job's start on a loaded store
  // and what brings its requests to under one per rank (tests/bench/README.md).
  std::chrono::microseconds gather{200};
  std::string log_prefix = "[ddprun store proxy]";
};

// Counters since the start (for tests, stats and the benchmark).
struct ProxyStats {
  uint64_t clients = 0;            // client connections accepted
  uint64_t client_requests = 0;    // requests received from clients
  uint64_t upstream_requests = 0;  // requests sent upstream (coalesced ones count once)
  uint64_t coalesced = 0;          // client requests answered by another's upstream request
  uint64_t resumes = 0;            // times the upstream link broke and its session resumed
  bool upstream_connected = false;
};

class StoreProxy {
 public:
  // Binds and listens (throws std::system_error like Server); connects upstream in the
  // background. Client requests wait for that connection.
  StoreProxy(boost::asio::io_context& io, ProxyOptions options);
  ~StoreProxy();  // closes everything
  StoreProxy(const StoreProxy&) = delete;
  StoreProxy& operator=(const StoreProxy&) = delete;

  uint16_t port() const;
  // Closes the listener, every client connection and the upstream link (idempotent).
  void close();
  ProxyStats stats() const;
  // Called once, on the io_context thread, when the upstream link cannot be made or breaks.
  void on_upstream_lost(std::function<void(const std::string& why)> callback);

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;  // shared with the coroutines and handlers it starts
};

// A StoreProxy on its own io_context thread. stats() may be called from any thread.
class ProxyThread {
 public:
  explicit ProxyThread(ProxyOptions options);  // throws like StoreProxy
  ~ProxyThread();
  ProxyThread(const ProxyThread&) = delete;
  ProxyThread& operator=(const ProxyThread&) = delete;

  uint16_t port() const { return port_; }
  ProxyStats stats();

 private:
  std::unique_ptr<boost::asio::io_context> io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> keep_;
  std::unique_ptr<StoreProxy> proxy_;
  std::thread thread_;
  uint16_t port_ = 0;
};

}  // namespace ddprun::store
