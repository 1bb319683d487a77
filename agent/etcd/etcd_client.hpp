// EtcdClient: the part of etcd's v3 API that the rendezvous needs, spoken as etcd serves it
// over HTTP/JSON (its gRPC gateway: POST /v3/kv/range, /v3/kv/put, /v3/kv/txn,
// /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke, /v3/watch), with Boost.Beast on
// the caller's executor. Keys and values are byte strings (base64 on the wire); revisions and
// lease ids are int64 (decimal strings on the wire).
//
// Endpoints and failover: a client talks to one member at a time over one kept-alive
// connection. When that member stops answering (connection refused or reset, a timeout, a
// malformed or oversized reply, "no leader"), the connection is closed and the request is
// retried on the next member, with a short back-off once every member has been tried, until
// the request's deadline. Requests must therefore be safe to repeat: every write the
// rendezvous makes is a compare-and-set transaction or an idempotent put (see EtcdStore).
//
// TLS: when EtcdOptions::tls, every connection is TLS, the member's certificate is checked
// against `cacert` (the system's CAs when empty) and the host name or IP address it was
// reached by; `cert`/`key` are the client's certificate (etcd's --client-cert-auth). A
// certificate that does not verify is EtcdError::kTls and not retried.
//
// Threads: one client is used from one executor, one request at a time. close() (same
// executor) ends a request in progress with EtcdError::kClosed. EtcdWatch is a separate
// connection with the same rules.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "agent/etcd/endpoint.hpp"

namespace ddprun::etcd {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

struct Options {
  std::vector<Endpoint> endpoints;
  bool tls = false;
  std::string cacert, cert, key;  // PEM files; empty = none (cacert: the system's CAs)
  // One attempt on one member (connect, TLS handshake, request and reply) gives up after this;
  // the request then moves to the next member.
  Millis attempt_timeout{std::chrono::seconds(5)};
  // TCP keep-alive on every connection (a watch parked for hours notices a vanished member).
  Millis keep_alive_interval{std::chrono::seconds(5)};
  int keep_alive_probes = 3;
  size_t max_reply_bytes = 64 << 20;  // a larger reply closes the connection (and is retried)
  // Called once when a request starts failing over because no member answers, and once when
  // one answers again; empty = silent.
  std::function<void(const std::string& line)> on_outage;
  // The member to try first, shared by every client and watch made from copies of these
  // options (one agent's): when one finds a member gone, the others start from the next.
  // Null: each keeps its own.
  std::shared_ptr<size_t> cursor;
};

class EtcdError : public std::runtime_error {
 public:
  enum class Kind {
    kUnavailable,  // no member answered before the deadline
    kClosed,       // close() was called
    kTls,          // a certificate did not verify, or the TLS set-up failed
    kAuth,         // etcd refused the request for lack of authentication or permission
    kRequest,      // etcd answered with an error for this request (e.g. lease not found)
    kCompacted,    // a watch asked for history etcd has compacted away
  };
  EtcdError(Kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

struct KeyValue {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0, version = 0, lease = 0;
};

// One comparison of a transaction: the key's create or mod revision, or its value, equal to
// the given one. A missing key has revisions 0 and matches no value.
struct Compare {
  enum class Target { kCreate, kMod, kValue };
  Target target = Target::kMod;
  std::string key;
  int64_t revision = 0;
  std::string value;
};

// One operation of a transaction: a range read of one key, or a put (with an optional lease).
struct Op {
  enum class Kind { kRange, kPut, kDelete };
  Kind kind = Kind::kRange;
  std::string key, value;
  int64_t lease = 0;
};

struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;  // the store's revision after the transaction
  // For each range op of the branch that ran, the key's value; nullopt when it is absent.
  std::vector<std::optional<KeyValue>> ranges;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t count = 0;  // keys in the range (all of them, also with count_only)
  int64_t revision = 0;
};

struct RangeOptions {
  int64_t revision = 0;     // read the store as of this revision (0: now)
  bool count_only = false;  // the count, no keys
};

using Deadline = Clock::time_point;

class EtcdClient {
 public:
  EtcdClient(boost::asio::any_io_executor executor, Options options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // [key, range_end) (range_end empty: the one key).
  boost::asio::awaitable<RangeResult> range(std::string key, std::string range_end,
                                            Deadline deadline, RangeOptions options = {});
  boost::asio::awaitable<TxnResult> txn(std::vector<Compare> compares, std::vector<Op> success,
                                        std::vector<Op> failure, Deadline deadline);
  // A new lease of `ttl` seconds: its id.
  boost::asio::awaitable<int64_t> lease_grant(int64_t ttl, Deadline deadline);
  // One keep-alive: the lease's remaining TTL in seconds, 0 when the lease no longer exists.
  boost::asio::awaitable<int64_t> lease_keep_alive(int64_t id, Deadline deadline);
  // Revokes the lease (deleting its keys); a lease that no longer exists is not an error.
  boost::asio::awaitable<void> lease_revoke(int64_t id, Deadline deadline);

  // Ends a request in progress (kClosed) and every later one.
  void close();

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

struct WatchEvent {
  bool deleted = false;
  KeyValue kv;  // for a delete: the key and its revision of deletion (mod_revision)
};

// A watch of [key, range_end) from `start_revision`: one streaming HTTP request on its own
// connection. next() returns the next batch of events; a lost connection (or a member that
// lost its leader: the watch asks for one) throws EtcdError(kUnavailable) and the caller
// starts a new watch from the revision after its last event. A compacted start revision
// throws kCompacted.
class EtcdWatch {
 public:
  EtcdWatch(boost::asio::any_io_executor executor, Options options);
  ~EtcdWatch();

  // Opens the stream, trying the members in turn until the deadline.
  boost::asio::awaitable<void> start(std::string key, std::string range_end, int64_t start_revision,
                                     Deadline deadline);
  // The next non-empty batch of events, or nullopt when the deadline passed first (the watch is
  // then closed).
  boost::asio::awaitable<std::optional<std::vector<WatchEvent>>> next(Deadline deadline);
  void close();

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The smallest key after every key that starts with `prefix` (etcd's prefix range end).
std::string prefix_end(const std::string& prefix);

// Base64 (standard alphabet, padded), as etcd's JSON gateway carries bytes.
std::string base64_encode(const std::string& bytes);
// Throws std::invalid_argument on bad input.
std::string base64_decode(const std::string& text);

constexpr Deadline kNoDeadline = Deadline::max();

}  // namespace ddprun::etcd
