#include "agent/health/http_connection.hpp"

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <limits>

namespace ddprun::agent::health_detail {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);

// Room in the receive buffer beyond the header limit, so that the parser, not the buffer,
// reports an oversized header (431 either way).
constexpr size_t kBufferSlack = 1024;
// A closing connection drops at most this much of what the client still sends, for at most
// this long (never longer than request_timeout).
constexpr size_t kLingerBytes = 64 * 1024;
constexpr std::chrono::milliseconds kLingerTime{1000};

using Response = http::response<http::string_body>;

bool is_header_safe(const std::string& value) {
  return value.find_first_of("\r\n") == std::string::npos;
}

// The response to send; `head` keeps Content-Length but drops the body.
Response make_response(const HttpResponse& out, unsigned version, bool keep_alive, bool head) {
  Response res;
  res.version(version);
  res.result(static_cast<unsigned>(out.status));
  res.set(http::field::content_type, out.content_type);
  res.set(http::field::cache_control, "no-store");
  if (out.status == 405) res.set(http::field::allow, "GET, HEAD");
  res.keep_alive(keep_alive);
  res.body() = out.body;
  res.prepare_payload();
  if (head) res.body().clear();
  return res;
}

HttpResponse plain(int status, std::string_view body) {
  HttpResponse out;
  out.status = status;
  out.body = std::string(body);
  return out;
}

std::string_view without_query(beast::string_view target) {
  std::string_view t(target.data(), target.size());
  return t.substr(0, t.find('?'));
}

}  // namespace

HttpConnection::HttpConnection(std::shared_ptr<Core> core, tcp::socket socket)
    : core_(std::move(core)),
      stream_(std::move(socket)),
      buffer_(core_->limits.max_header_bytes + kBufferSlack) {
  core_->connections.insert(this);
}

HttpConnection::~HttpConnection() {
  core_->connections.erase(this);
}

void HttpConnection::start() {
  boost::system::error_code ec;
  stream_.socket().set_option(tcp::no_delay(true), ec);
  asio::co_spawn(stream_.get_executor(), run(shared_from_this()), asio::detached);
}

void HttpConnection::close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.close();
}

asio::awaitable<void> HttpConnection::run(std::shared_ptr<HttpConnection> self) {
  HttpConnection& c = *self;
  try {
    while (!c.closed_ && !c.core_->closed) {
      const bool keep_going = co_await c.serve_one();
      if (!keep_going) break;
    }
  } catch (...) {
    // Nothing here throws by design (allocation failure at worst): drop this connection only.
  }
  c.close();
}

asio::awaitable<bool> HttpConnection::wait_first_byte(Clock::time_point deadline) {
  stream_.expires_at(deadline);
  auto room = std::min<size_t>(1024, buffer_.max_size() - buffer_.size());
  auto [ec, n] = co_await stream_.async_read_some(buffer_.prepare(room), kUseTuple);
  if (ec || closed_) co_return false;
  buffer_.commit(n);
  co_return true;
}

asio::awaitable<bool> HttpConnection::serve_one() {
  const HealthServer::Limits& limits = core_->limits;
  // The request's clock starts at the connection's opening or at the previous response.
  const auto start = Clock::now();
  waiting_since_ = start;
  const auto request_deadline = start + limits.request_timeout;
  if (buffer_.size() == 0) {  // else a pipelined request has begun already
    const auto first_byte_deadline = std::min(request_deadline, start + limits.idle_timeout);
    const bool started = co_await wait_first_byte(first_byte_deadline);
    if (!started) co_return false;
  }

  http::request_parser<http::empty_body> parser;
  parser.header_limit(static_cast<std::uint32_t>(
      std::min<size_t>(limits.max_header_bytes, std::numeric_limits<std::uint32_t>::max())));
  stream_.expires_at(request_deadline);
  auto [ec, unused] = co_await http::async_read_header(stream_, buffer_, parser, kUseTuple);
  if (closed_) co_return false;
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
    const std::string_view body = "request header too large\n";
    co_await refuse(431, body);
    co_return false;
  }
  if (ec == http::error::body_limit) {
    const std::string_view body = "request bodies are not accepted\n";
    co_await refuse(413, body);
    co_return false;
  }
  if (ec) co_return false;  // timeout, EOF, reset, or bytes that are not HTTP

  const auto& req = parser.get();
  const bool has_body = !parser.is_done();  // Content-Length > 0 or chunked
  const bool head = req.method() == http::verb::head;
  const bool keep_alive = req.keep_alive() && !has_body;
  HttpResponse out;
  if (!head && req.method() != http::verb::get) {
    out = plain(405, "method not allowed\n");
  } else if (has_body) {
    const std::string_view body = "request bodies are not accepted\n";
    co_await refuse(413, body);
    co_return false;
  } else {
    out = call_handler(without_query(req.target()));
    if (closed_ || core_->closed) co_return false;  // the handler closed the server
  }

  Response res = make_response(out, req.version() == 10 ? 10 : 11, keep_alive, head);
  stream_.expires_after(limits.request_timeout);
  auto [write_ec, written] = co_await http::async_write(stream_, res, kUseTuple);
  if (write_ec || closed_) co_return false;
  if (!keep_alive) {
    co_await linger_close();
    co_return false;
  }
  co_return true;
}

HttpResponse HttpConnection::call_handler(std::string_view target) {
  if (!core_->handler) return plain(503, "shutting down\n");
  HttpResponse out;
  core_->handler_running = true;
  try {
    out = core_->handler(target);
  } catch (const std::exception& e) {
    core_->log_once(&core_->logged_handler_error,
                    std::string("health handler failed (answered 500): ") + e.what());
    out = plain(500, "internal error\n");
  } catch (...) {
    core_->log_once(&core_->logged_handler_error, "health handler failed (answered 500)");
    out = plain(500, "internal error\n");
  }
  core_->handler_running = false;
  if (core_->closed) core_->handler = nullptr;  // the server was destroyed by the handler
  if (out.status < 100 || out.status > 999 || !is_header_safe(out.content_type)) {
    out = plain(500, "internal error: invalid response\n");
  }
  return out;
}

asio::awaitable<void> HttpConnection::refuse(int status, std::string_view body) {
  Response res = make_response(plain(status, body), 11, false, false);
  stream_.expires_after(core_->limits.request_timeout);
  auto [ec, written] = co_await http::async_write(stream_, res, kUseTuple);
  if (!ec && !closed_) co_await linger_close();
}

asio::awaitable<void> HttpConnection::linger_close() {
  boost::system::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream_.expires_after(std::min<Clock::duration>(kLingerTime, core_->limits.request_timeout));
  buffer_.clear();
  size_t dropped = 0;
  while (!closed_ && dropped < kLingerBytes) {
    auto room = std::min<size_t>(4096, buffer_.max_size());
    auto [ec, n] = co_await stream_.async_read_some(buffer_.prepare(room), kUseTuple);
    if (ec) break;
    dropped += n;
  }
  close();
}

}  // namespace ddprun::agent::health_detail
