// A byte-level TCP client for server tests: sends exact bytes, reads exact byte counts.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "store/sys/fd.hpp"

namespace ddprun::store::test {

class RawConn {
 public:
  // `source`: the IPv4 address to connect from (e.g. "127.0.0.2"); empty = the kernel's pick.
  explicit RawConn(uint16_t port, const std::string& host = "127.0.0.1",
                   const std::string& source = "");
  void send(std::string_view bytes);
  // Exactly n bytes; fails the test (and returns what arrived) on EOF or after `timeout`.
  std::string recv(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(20));
  // True once the server closes the connection (EOF or reset) within `timeout`; bytes that
  // arrive first are discarded.
  bool closed_by_peer(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  int fd() const { return fd_.get(); }
  uint16_t local_port() const;  // this end's port (IPv4)

 private:
  sys::UniqueFd fd_;
};

std::string i64_bytes(int64_t v);
std::string str_bytes(std::string_view s);

}  // namespace ddprun::store::test
