// HealthServer: a small HTTP/1.1 server for the agent's health endpoints (/health, /metrics...),
// on Boost.Beast and C++20 coroutines, one coroutine per connection on the agent's io_context.
// It serves GET and HEAD only and calls one handler for the content; everything else about HTTP
// (limits, keep-alive, the refusals below) is decided here.
//
// Threads: construct, destroy and call every method on the io_context's thread (or while the
// io_context is not running); the handler is called on that thread. Destroy the server before
// its io_context.
//
// What a client gets (each limit is in Limits, so tests can shorten them):
//   - GET/HEAD: the handler's status, Content-Type and body (HEAD: the headers only, with the
//     body's Content-Length). Every response has Content-Length and `Cache-Control: no-store`.
//   - another method: 405 with `Allow: GET, HEAD`.
//   - a request with a body (Content-Length > 0 or chunked): 413, then the connection closes.
//   - a header over max_header_bytes: 431, then the connection closes.
//   - bytes that are not HTTP: the connection closes without a response.
//   - keep-alive (HTTP/1.1's default, or HTTP/1.0's `Connection: keep-alive`) until the client
//     asks `Connection: close` or a timeout below ends it.
//   - a request must be complete within request_timeout of the connection opening or of the
//     previous response (slow clients, "slowloris", cannot hold a connection open), and start
//     within idle_timeout; otherwise the connection closes without a response.
//   - with max_connections open, a new one is accepted and the connection that has waited
//     longest for its request (or to write its response) is closed: probes are answered
//     whatever idle, slow or unread connections hold the server.
// A handler that throws gets its client a 500. Nothing is logged per request; refused
// connections (over the limit, accept failures) are logged once per reason.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

struct HttpResponse {
  int status = 200;  // 100-999; anything else is sent as 500
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Called on the io_context thread for every complete GET/HEAD request; `target` is the request
// target without the query string ("/metrics" for "GET /metrics?x=1"). Its body is dropped for
// HEAD. It may throw (the client gets a 500).
using HttpHandler = std::function<HttpResponse(std::string_view target)>;

namespace health_detail {
struct Core;
}

class HealthServer {
 public:
  struct Limits {
    size_t max_header_bytes = 8 * 1024;  // request line and header fields together
    // From the connection opening, or the previous response written, to a complete request.
    std::chrono::milliseconds request_timeout{5000};
    // From the connection opening, or the previous response written, to the request's first
    // byte (a kept-alive connection's idle time; never more than request_timeout).
    std::chrono::milliseconds idle_timeout{5000};
    size_t max_connections = 64;
  };

  // Binds host:port (port 0: an ephemeral port) with SO_REUSEADDR and starts accepting on `io`.
  // `host` must be an IP literal ("127.0.0.1", "::1", "0.0.0.0", "::"; "::" also takes IPv4).
  // Throws std::system_error whose what() names the endpoint
  // ("cannot serve health on 127.0.0.1:8080: Address already in use").
  HealthServer(boost::asio::io_context& io, const std::string& host, int port, HttpHandler handler);
  HealthServer(boost::asio::io_context& io, const std::string& host, int port, HttpHandler handler,
               Limits limits);
  // Closes the listener and every open connection at once (clients see EOF) and drops the
  // handler. Coroutines still suspended on the io_context end on their next resumption and
  // touch only state they share ownership of; the handler is never called again.
  ~HealthServer();
  HealthServer(const HealthServer&) = delete;
  HealthServer& operator=(const HealthServer&) = delete;

  int port() const { return port_; }  // the bound port
  size_t open_connections() const;    // being served now (refused ones are not counted)

 private:
  std::shared_ptr<health_detail::Core> core_;  // shared with every connection's coroutine
  int port_ = 0;
};

}  // namespace ddprun::agent
