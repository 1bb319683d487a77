// Load generator building blocks: many non-blocking client sockets driven by one epoll loop,
// each with one request in flight (as real TCPStore clients behave), in either dialect.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "store/protocol.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::store::bench {

using Clock = std::chrono::steady_clock;

// Frames for the dialect under test (1.13 numbering or 2.x numbering).
struct Frames {
  Dialect dialect;
  std::string set(std::string_view key, std::string_view value) const;
  std::string get(std::string_view key) const;
  std::string add(std::string_view key, int64_t delta) const;
  std::string wait(std::string_view key) const;
  std::string wait(const std::vector<std::string>& keys) const;  // all of them
  std::string num_keys() const;
  uint8_t opcode(Op op) const;
};

struct Conn {
  sys::UniqueFd fd;
  std::string in;     // reply bytes received so far
  size_t want = 0;    // reply bytes expected for the request in flight
  uint64_t done = 0;  // completed requests
  bool failed = false;
};

// Opens n connections to host:port (non-blocking connects in batches, so the server's
// accept backlog is not overrun), completes the 2.x handshake when asked. Connections that
// fail are returned with failed = true.
std::vector<Conn> connect_all(const std::string& host, uint16_t port, size_t n, Dialect dialect,
                              Clock::time_point deadline);

// Sends all of `bytes` (blocking with poll on EAGAIN). False on error.
bool send_all(Conn& c, const std::string& bytes, Clock::time_point deadline);
// Receives exactly n bytes into c.in (replacing it). False on error or deadline.
bool recv_exact(Conn& c, size_t n, Clock::time_point deadline);

// Drives every connection with one request in flight: `next(conn_index, conn)` returns the
// next request and sets conn.want; each reply of conn.want bytes is checked by
// `check(conn_index, conn)` and counted. New requests stop at `stop`; replies still in
// flight are collected until `hard_deadline`. Returns the time the last reply arrived.
struct Driver {
  std::function<std::string(size_t, Conn&)> next;
  std::function<bool(size_t, Conn&)> check;
  Clock::time_point run(std::vector<Conn>& conns, Clock::time_point stop,
                        Clock::time_point hard_deadline, bool send_first = true);
};

}  // namespace ddprun::store::bench
