// A blocking HTTP/1.1 client for HealthServer's tests: real sockets to 127.0.0.1, a receive
// timeout as a safety net (a broken server fails a test instead of hanging it), and a strict
// enough response reader to notice stray body bytes.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "store/sys/fd.hpp"

namespace ddprun::agent::health_testing {

struct ParsedResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;

  // The header's value, or "" when absent.
  std::string header(const std::string& lower_name) const;
};

// "GET <target> HTTP/1.1" with a Host header, `extra` header lines ("Name: value\r\n"...) and
// the blank line.
std::string request(std::string_view method, std::string_view target, std::string_view extra = "");

class TestClient {
 public:
  // Connects to 127.0.0.1:port (fails the test if it cannot).
  explicit TestClient(int port);

  // Sends all of `data`; false when the server already closed.
  bool send(std::string_view data);
  // Reads one response (for a HEAD request, the headers only: Content-Length is not read);
  // nullopt when the connection closed or timed out first.
  std::optional<ParsedResponse> read_response(bool head = false);
  // Reads until the server closes (EOF or reset): true then, false on the receive timeout.
  // What arrived meanwhile is appended to *received.
  bool wait_closed(std::string* received = nullptr);

  // Whether a TCP connection to 127.0.0.1:port is accepted by the kernel.
  static bool can_connect(int port);

 private:
  bool fill();  // one recv into pending_; false on EOF, error or timeout

  sys::UniqueFd fd_;
  std::string pending_;  // received, not yet consumed
};

}  // namespace ddprun::agent::health_testing
