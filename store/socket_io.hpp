// Blocking-with-deadline TCP helpers for the client (POSIX sockets + poll). Sockets are kept
// non-blocking; every call takes an absolute deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "store/sys/fd.hpp"

namespace ddprun::store::socket_io {

using Clock = std::chrono::steady_clock;

enum class Status { kOk, kTimeout, kClosed, kError };

// One connection attempt to every address of host:port, in order, until one succeeds or
// the deadline passes. On failure returns an empty fd and sets *error.
sys::UniqueFd connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline,
                          std::string* error);
Status send_all(int fd, const char* data, size_t size, Clock::time_point deadline);
Status recv_exact(int fd, char* data, size_t size, Clock::time_point deadline);
// Waits until the socket is readable (or closed) without consuming anything.
Status wait_readable(int fd, Clock::time_point deadline);
// TCP keep-alive: the first probe after `interval` idle, then one every `interval`; the
// connection fails after about interval x probes without an answer (TCP_USER_TIMEOUT too,
// for data the vanished peer never acknowledges). False (errno set) if a setsockopt failed.
bool set_keep_alive(int fd, std::chrono::milliseconds interval, int probes);

}  // namespace ddprun::store::socket_io
