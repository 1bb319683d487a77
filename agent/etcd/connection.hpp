// One connection to one etcd member, TCP or TLS over TCP, as EtcdClient and EtcdWatch use it:
// opening it (name lookup, TCP keep-alive, the TLS handshake checked against the name or
// address the member was reached by), HTTP requests and replies over it, and what a failed
// attempt on it means. Private to agent/etcd.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <memory>
#include <optional>
#include <string>

#include "agent/etcd/etcd_client.hpp"

namespace ddprun::etcd::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

// Whether `ec` is a TLS failure (a stream cut short without TLS's close is not).
bool is_tls_failure(const boost::system::error_code& ec);

class Connection {
 public:
  // `o` must outlive the connection; `ctx` null: plain TCP.
  Connection(asio::any_io_executor ex, const Options& o, const Endpoint& ep, ssl::context* ctx,
             size_t index);

  beast::tcp_stream& lowest() { return tls_ ? beast::get_lowest_layer(*tls_) : *tcp_; }
  const Endpoint& endpoint() const { return ep_; }
  size_t index() const { return index_; }  // in Options::endpoints
  std::string name() const;

  void close();

  asio::awaitable<void> open(Deadline deadline);

  // Why the TLS handshake failed, in words.
  std::string tls_failure(const boost::system::error_code& ec);

  asio::awaitable<void> write(http::request<http::string_body>& req);

  template <class Parser>
  asio::awaitable<void> read(Parser& p) {
    if (tls_) {
      co_await http::async_read(*tls_, buf_, p, asio::use_awaitable);
    } else {
      co_await http::async_read(*tcp_, buf_, p, asio::use_awaitable);
    }
  }

  template <class Parser>
  asio::awaitable<void> read_header(Parser& p) {
    if (tls_) {
      co_await http::async_read_header(*tls_, buf_, p, asio::use_awaitable);
    } else {
      co_await http::async_read_header(*tcp_, buf_, p, asio::use_awaitable);
    }
  }

  template <class Parser>
  asio::awaitable<boost::system::error_code> read_some(Parser& p) {
    boost::system::error_code ec;
    auto token = asio::redirect_error(asio::use_awaitable, ec);
    if (tls_) {
      co_await http::async_read_some(*tls_, buf_, p, token);
    } else {
      co_await http::async_read_some(*tcp_, buf_, p, token);
    }
    co_return ec;
  }

  // A POST of `body` (JSON) to `path`, keeping the connection alive.
  http::request<http::string_body> request(const std::string& path, std::string body) const;

 private:
  asio::any_io_executor ex_;
  const Options& o_;
  Endpoint ep_;
  size_t index_;
  std::optional<beast::tcp_stream> tcp_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
  beast::flat_buffer buf_;
};

// What one failed attempt on one member says: the text for the failover, or (thrown) the end
// of the request: close() was called, or TLS failed (a certificate that does not verify, or
// TLS 1.3's "certificate required" after the handshake: every member would say the same).
std::string attempt_failure(const boost::system::system_error& e, Connection* conn, bool closed);

// The TLS client context of `o` (null when !o.tls); a file that does not load throws
// EtcdError(kTls).
std::unique_ptr<ssl::context> make_tls_context(const Options& o);

}  // namespace ddprun::etcd::detail
