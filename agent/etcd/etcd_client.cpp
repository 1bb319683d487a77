#include "agent/etcd/etcd_client.hpp"

#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cstdio>
#include <cstring>

#include "store/socket_io.hpp"
#include "store/sys/net.hpp"

namespace ddprun::etcd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using asio::use_awaitable;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using Kind = EtcdError::Kind;

// ---------------------------------------------------------------------------------------------
// Text helpers.

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  auto at = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(bytes[k])); };
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = at(i) << 16 | at(i + 1) << 8 | at(i + 2);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  if (size_t rest = bytes.size() - i) {
    uint32_t v = at(i) << 16 | (rest == 2 ? at(i + 1) << 8 : 0);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64_decode(const std::string& text) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  size_t pad = 0;
  for (char ch : text) {
    if (ch == '=') {
      ++pad;
      continue;
    }
    const char* p = std::strchr(kAlphabet, ch);
    if (ch == '\0' || !p || pad) throw std::invalid_argument("not base64");
    acc = acc << 6 | static_cast<uint32_t>(p - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  if (pad > 2) throw std::invalid_argument("not base64");
  return out;
}

namespace {

// ---------------------------------------------------------------------------------------------
// JSON as the gateway writes it: int64 as decimal strings, bytes as base64, defaults omitted.

int64_t i64(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_string()) return std::stoll(it->get<std::string>());
  return it->get<int64_t>();
}

std::string bytes(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return {};
  return base64_decode(it->get<std::string>());
}

KeyValue kv_from(const json& j) {
  KeyValue kv;
  kv.key = bytes(j, "key");
  kv.value = bytes(j, "value");
  kv.create_revision = i64(j, "create_revision");
  kv.mod_revision = i64(j, "mod_revision");
  kv.version = i64(j, "version");
  kv.lease = i64(j, "lease");
  return kv;
}

json op_json(const Op& op) {
  switch (op.kind) {
    case Op::Kind::kRange:
      return {{"request_range", {{"key", base64_encode(op.key)}}}};
    case Op::Kind::kPut: {
      json put = {{"key", base64_encode(op.key)}, {"value", base64_encode(op.value)}};
      if (op.lease) put["lease"] = std::to_string(op.lease);
      return {{"request_put", std::move(put)}};
    }
    case Op::Kind::kDelete:
      return {{"request_delete_range", {{"key", base64_encode(op.key)}}}};
  }
  return {};
}

json compare_json(const Compare& c) {
  json j = {{"key", base64_encode(c.key)}, {"result", "EQUAL"}};
  switch (c.target) {
    case Compare::Target::kCreate:
      j["target"] = "CREATE";
      j["create_revision"] = std::to_string(c.revision);
      break;
    case Compare::Target::kMod:
      j["target"] = "MOD";
      j["mod_revision"] = std::to_string(c.revision);
      break;
    case Compare::Target::kValue:
      j["target"] = "VALUE";
      j["value"] = base64_encode(c.value);
      break;
  }
  return j;
}

bool is_tls_failure(const boost::system::error_code& ec) {
  return ec.category() == asio::error::get_ssl_category() &&
         ec != asio::ssl::error::stream_truncated;
}

// ---------------------------------------------------------------------------------------------
// One connection to one member: TCP, or TLS over TCP.

class Connection {
 public:
  Connection(asio::any_io_executor ex, const Options& o, const Endpoint& ep, ssl::context* ctx,
             size_t index)
      : ex_(std::move(ex)), o_(o), ep_(ep), index_(index) {
    if (ctx) {
      tls_.emplace(ex_, *ctx);
    } else {
      tcp_.emplace(ex_);
    }
  }

  beast::tcp_stream& lowest() { return tls_ ? beast::get_lowest_layer(*tls_) : *tcp_; }
  const Endpoint& endpoint() const { return ep_; }
  size_t index() const { return index_; }  // in Options::endpoints
  std::string name() const { return sys::endpoint_text(ep_.host, ep_.port); }

  void close() {
    boost::system::error_code ec;
    lowest().socket().close(ec);
  }

  asio::awaitable<void> open(Deadline deadline) {
    lowest().expires_at(deadline);
    boost::system::error_code ec;
    auto literal = asio::ip::make_address(ep_.host, ec);
    const bool is_literal = !ec;
    if (is_literal) {
      co_await lowest().async_connect(tcp::endpoint(literal, ep_.port), use_awaitable);
    } else {
      tcp::resolver resolver(ex_);
      auto results =
          co_await resolver.async_resolve(ep_.host, std::to_string(ep_.port), use_awaitable);
      co_await lowest().async_connect(results, use_awaitable);
    }
    auto& sock = lowest().socket();
    sock.set_option(tcp::no_delay(true), ec);
    if (o_.keep_alive_probes > 0) {
      store::socket_io::set_keep_alive(sock.native_handle(), o_.keep_alive_interval,
                                       o_.keep_alive_probes);
    }
    if (tls_) {
      SSL* ssl_handle = tls_->native_handle();
      X509_VERIFY_PARAM* param = SSL_get0_param(ssl_handle);
      if (!is_literal) {
        SSL_set_tlsext_host_name(ssl_handle, ep_.host.c_str());
        X509_VERIFY_PARAM_set1_host(param, ep_.host.c_str(), 0);
      } else {
        X509_VERIFY_PARAM_set1_ip_asc(param, ep_.host.c_str());
      }
      co_await tls_->async_handshake(ssl::stream_base::client, use_awaitable);
    }
  }

  // Why the TLS handshake failed, in words.
  std::string tls_failure(const boost::system::error_code& ec) {
    std::string why = ec.message();
    if (tls_) {
      long verify = SSL_get_verify_result(tls_->native_handle());
      if (verify != X509_V_OK) {
        why = std::string("certificate verify failed: ") + X509_verify_cert_error_string(verify) +
              " (is cacert= the CA that signed etcd's?)";
      } else if (o_.cert.empty() && why.find("alert") != std::string::npos) {
        why +=
            " (etcd refused this client: it asks for a client certificate, --rdzv-conf "
            "cert=PATH,key=PATH)";
      }
    }
    return why;
  }

  asio::awaitable<void> write(http::request<http::string_body>& req) {
    if (tls_) {
      co_await http::async_write(*tls_, req, use_awaitable);
    } else {
      co_await http::async_write(*tcp_, req, use_awaitable);
    }
  }

  template <class Parser>
  asio::awaitable<void> read(Parser& p) {
    if (tls_) {
      co_await http::async_read(*tls_, buf_, p, use_awaitable);
    } else {
      co_await http::async_read(*tcp_, buf_, p, use_awaitable);
    }
  }

  template <class Parser>
  asio::awaitable<void> read_header(Parser& p) {
    if (tls_) {
      co_await http::async_read_header(*tls_, buf_, p, use_awaitable);
    } else {
      co_await http::async_read_header(*tcp_, buf_, p, use_awaitable);
    }
  }

  template <class Parser>
  asio::awaitable<boost::system::error_code> read_some(Parser& p) {
    boost::system::error_code ec;
    auto token = asio::redirect_error(use_awaitable, ec);
    if (tls_) {
      co_await http::async_read_some(*tls_, buf_, p, token);
    } else {
      co_await http::async_read_some(*tcp_, buf_, p, token);
    }
    co_return ec;
  }

  http::request<http::string_body> request(const std::string& path, std::string body) const {
    http::request<http::string_body> req{http::verb::post, path, 11};
    req.set(http::field::host, name());
    req.set(http::field::content_type, "application/json");
    req.set(http::field::user_agent, "ddprun");
    req.keep_alive(true);
    req.body() = std::move(body);
    req.prepare_payload();
    return req;
  }

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
std::string attempt_failure(const boost::system::system_error& e, Connection* conn, bool closed) {
  if (closed) throw EtcdError(Kind::kClosed, "etcd client closed");
  if (conn && is_tls_failure(e.code())) {
    throw EtcdError(Kind::kTls,
                    "TLS with etcd at " + conn->name() + " failed: " + conn->tls_failure(e.code()));
  }
  return e.code() == beast::error::timeout ? "no answer in time" : e.code().message();
}

std::unique_ptr<ssl::context> make_tls_context(const Options& o) {
  if (!o.tls) return nullptr;
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_client);
  try {
    ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                     ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    ctx->set_verify_mode(ssl::verify_peer);
    if (o.cacert.empty()) {
      ctx->set_default_verify_paths();
    } else {
      ctx->load_verify_file(o.cacert);
    }
    if (!o.cert.empty()) ctx->use_certificate_chain_file(o.cert);
    if (!o.key.empty()) ctx->use_private_key_file(o.key, ssl::context::pem);
  } catch (const boost::system::system_error& e) {
    throw EtcdError(Kind::kTls, "etcd TLS set-up (cacert=" + o.cacert + ", cert=" + o.cert +
                                    ", key=" + o.key + "): " + e.code().message());
  }
  return ctx;
}

// One client's (or watch's) failover state: which member to try (shared through
// Options::cursor), back-off and outage reports.
class Members {
 public:
  Members(asio::any_io_executor ex, const Options& o)
      : o_(o), at_(o.cursor ? o.cursor : std::make_shared<size_t>(0)), timer_(ex) {
    if (o_.endpoints.empty()) throw std::invalid_argument("etcd: no endpoints");
  }
  size_t index() const { return *at_ % o_.endpoints.size(); }
  const Endpoint& current() const { return o_.endpoints[index()]; }

  // Member `used` failed: move on (unless another client already did); after a whole cycle,
  // report and back off.
  asio::awaitable<void> failed(const std::string& what, Deadline deadline, size_t used) {
    const Endpoint& e = o_.endpoints[used];
    last_error_ = sys::endpoint_text(e.host, e.port) + ": " + what;
    if (index() == used) *at_ = (used + 1) % o_.endpoints.size();
    if (++tried_ < o_.endpoints.size()) co_return;
    tried_ = 0;
    if (!outage_since_) {
      outage_since_ = Clock::now();
      if (o_.on_outage) {
        o_.on_outage("etcd unreachable (" + last_error_ + "); retrying " +
                     endpoints_text(o_.endpoints));
      }
    }
    auto until = std::min(deadline, Clock::now() + backoff_);
    backoff_ = std::min(backoff_ * 2, Millis(1000));
    timer_.expires_at(until);
    boost::system::error_code ec;
    co_await timer_.async_wait(asio::redirect_error(use_awaitable, ec));
  }

  void succeeded() {
    tried_ = 0;
    backoff_ = Millis(20);
    if (outage_since_) {
      auto secs = std::chrono::duration<double>(Clock::now() - *outage_since_).count();
      outage_since_.reset();
      if (o_.on_outage) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.1f", secs);
        o_.on_outage("etcd answers again at " + sys::endpoint_text(current().host, current().port) +
                     " (after " + buf + " s)");
      }
    }
  }

  std::string unavailable() const {
    std::string hint;
    if (!o_.tls && last_error_.find("end of stream") != std::string::npos) {
      hint = " (if etcd serves TLS: --rdzv-conf protocol=https,cacert=PATH)";
    }
    return "no etcd member answered (" + endpoints_text(o_.endpoints) + ")" +
           (last_error_.empty() ? "" : ": last error: " + last_error_) + hint;
  }

  void cancel() { timer_.cancel(); }

 private:
  const Options& o_;
  std::shared_ptr<size_t> at_;
  size_t tried_ = 0;
  Millis backoff_{20};
  std::optional<Clock::time_point> outage_since_;
  std::string last_error_;
  asio::steady_timer timer_;
};

// The gateway's error body: {"error": "...", "code": N, "message": "..."}.
struct ErrorReply {
  int code = 0;
  std::string message;
};

ErrorReply error_of(const std::string& body) {
  ErrorReply e;
  try {
    json j = json::parse(body);
    if (j.contains("result") && j["result"].is_object() == false && j.contains("error")) {
      j = j["error"];
    }
    if (j.contains("error") && j["error"].is_object()) j = j["error"];
    e.code = j.value("code", j.value("grpc_code", 0));
    e.message = j.value("message", j.value("error", std::string()));
  } catch (const std::exception&) {
    e.message = body.substr(0, 200);
  }
  return e;
}

bool retryable(unsigned status, const ErrorReply& e) {
  // gRPC Unavailable (14), DeadlineExceeded (4), Aborted (10); etcd's "no leader", "leader
  // changed", "request timed out" and "too many requests" pass on to another member or wait.
  // A member shutting down answers "the client connection is closing" (Canceled, 1).
  if (status >= 500 && status != 501) return true;
  if (e.code == 1 || e.code == 4 || e.code == 8 || e.code == 10 || e.code == 14) return true;
  for (const char* s : {"no leader", "leader changed", "timed out", "too many requests",
                        "not capable", "stopped", "closing", "unhealthy"}) {
    if (e.message.find(s) != std::string::npos) return true;
  }
  return false;
}

bool auth_failure(unsigned status, const ErrorReply& e) {
  return status == 401 || status == 403 || e.code == 16 || e.code == 7 ||
         e.message.find("user name is empty") != std::string::npos ||
         e.message.find("invalid auth token") != std::string::npos;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// EtcdClient

// What a client and a watch both hold: the options, the TLS context, the failover state and
// the connection to the current member.
struct MemberLink {
  MemberLink(asio::any_io_executor ex, Options o)
      : ex_(std::move(ex)), o_(std::move(o)), ctx_(make_tls_context(o_)), members_(ex_, o_) {}

  void close() {
    closed_ = true;
    members_.cancel();
    if (conn_) conn_->close();
  }

  asio::any_io_executor ex_;
  Options o_;
  std::unique_ptr<ssl::context> ctx_;
  Members members_;
  std::unique_ptr<Connection> conn_;
  bool closed_ = false;
};

class EtcdClient::Impl : public MemberLink, public std::enable_shared_from_this<EtcdClient::Impl> {
 public:
  using MemberLink::MemberLink;

  asio::awaitable<json> call(std::string path, std::string body, Deadline deadline) {
    auto self = shared_from_this();
    for (;;) {
      if (closed_) throw EtcdError(Kind::kClosed, "etcd client closed");
      const auto now = Clock::now();
      if (now >= deadline) throw EtcdError(Kind::kUnavailable, members_.unavailable());
      const Deadline attempt = std::min(deadline, now + o_.attempt_timeout);
      // Another client of the same cursor moved on from this connection's member: follow.
      if (conn_ && conn_->index() != members_.index()) {
        conn_->close();
        conn_.reset();
      }
      const size_t used = members_.index();
      std::string failure;
      try {
        if (!conn_) {
          conn_ = std::make_unique<Connection>(ex_, o_, members_.current(), ctx_.get(), used);
          co_await conn_->open(attempt);
        }
        conn_->lowest().expires_at(attempt);
        auto req = conn_->request(path, body);
        co_await conn_->write(req);
        http::response_parser<http::string_body> parser;
        parser.body_limit(o_.max_reply_bytes);
        co_await conn_->read(parser);
        auto res = parser.release();
        const unsigned status = res.result_int();
        if (!res.keep_alive()) conn_.reset();
        if (status == 200) {
          json j = json::parse(res.body());
          members_.succeeded();
          co_return j;
        }
        ErrorReply e = error_of(res.body());
        const std::string where =
            "etcd at " + sys::endpoint_text(members_.current().host, members_.current().port);
        if (auth_failure(status, e)) {
          throw EtcdError(Kind::kAuth, where + " refused the request (" + e.message +
                                           "): ddprun does not log in to etcd with a user; "
                                           "use client certificates (--rdzv-conf cert=,key=)");
        }
        if (!retryable(status, e)) {
          members_.succeeded();
          throw EtcdError(Kind::kRequest, where + ": " + path + ": " + e.message);
        }
        failure = "HTTP " + std::to_string(status) + ": " + e.message;
      } catch (const EtcdError&) {
        throw;
      } catch (const boost::system::system_error& e) {
        failure = attempt_failure(e, conn_.get(), closed_);
      } catch (const json::exception& e) {
        failure = std::string("malformed reply: ") + e.what();
      } catch (const std::invalid_argument& e) {
        failure = std::string("malformed reply: ") + e.what();
      } catch (const std::out_of_range& e) {
        failure = std::string("malformed reply: ") + e.what();
      }
      if (conn_) conn_->close();
      conn_.reset();
      co_await members_.failed(failure, deadline, used);
    }
  }
};

EtcdClient::EtcdClient(asio::any_io_executor executor, Options options)
    : impl_(std::make_shared<Impl>(std::move(executor), std::move(options))) {}

EtcdClient::~EtcdClient() {
  impl_->close();
}

void EtcdClient::close() {
  impl_->close();
}

asio::awaitable<RangeResult> EtcdClient::range(std::string key, std::string range_end,
                                               Deadline deadline, RangeOptions options) {
  json body = {{"key", base64_encode(key)}};
  if (!range_end.empty()) body["range_end"] = base64_encode(range_end);
  if (options.revision) body["revision"] = std::to_string(options.revision);
  if (options.count_only) body["count_only"] = true;
  std::string path = "/v3/kv/range";
  json j = co_await impl_->call(std::move(path), body.dump(), deadline);
  RangeResult r;
  r.revision = i64(j.value("header", json::object()), "revision");
  r.count = i64(j, "count");
  if (j.contains("kvs")) {
    for (const auto& kv : j["kvs"]) r.kvs.push_back(kv_from(kv));
  }
  co_return r;
}

asio::awaitable<TxnResult> EtcdClient::txn(std::vector<Compare> compares, std::vector<Op> success,
                                           std::vector<Op> failure, Deadline deadline) {
  json body = {{"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
  for (const auto& c : compares) body["compare"].push_back(compare_json(c));
  for (const auto& op : success) body["success"].push_back(op_json(op));
  for (const auto& op : failure) body["failure"].push_back(op_json(op));
  std::string path = "/v3/kv/txn";
  json j = co_await impl_->call(std::move(path), body.dump(), deadline);
  TxnResult r;
  r.succeeded = j.value("succeeded", false);
  r.revision = i64(j.value("header", json::object()), "revision");
  if (j.contains("responses")) {
    for (const auto& resp : j["responses"]) {
      auto it = resp.find("response_range");
      if (it == resp.end()) continue;
      if (it->contains("kvs") && !(*it)["kvs"].empty()) {
        r.ranges.push_back(kv_from((*it)["kvs"][0]));
      } else {
        r.ranges.push_back(std::nullopt);
      }
    }
  }
  co_return r;
}

asio::awaitable<int64_t> EtcdClient::lease_grant(int64_t ttl, Deadline deadline) {
  json body = {{"TTL", std::to_string(ttl)}, {"ID", "0"}};
  std::string path = "/v3/lease/grant";
  json j = co_await impl_->call(std::move(path), body.dump(), deadline);
  if (j.contains("error") && j["error"].is_string() && !j["error"].get<std::string>().empty()) {
    throw EtcdError(Kind::kRequest, "etcd lease grant: " + j["error"].get<std::string>());
  }
  const int64_t id = i64(j, "ID");
  if (id == 0) throw EtcdError(Kind::kRequest, "etcd lease grant: no lease id in the reply");
  co_return id;
}

asio::awaitable<int64_t> EtcdClient::lease_keep_alive(int64_t id, Deadline deadline) {
  json body = {{"ID", std::to_string(id)}};
  std::string path = "/v3/lease/keepalive";
  json j = co_await impl_->call(std::move(path), body.dump(), deadline);
  // A streaming call: {"result": {...}} (the first message is all there is).
  if (j.contains("error")) {
    ErrorReply e = error_of(j.dump());
    throw EtcdError(Kind::kRequest, "etcd lease keep-alive: " + e.message);
  }
  const json& r = j.contains("result") ? j["result"] : j;
  co_return i64(r, "TTL");
}

asio::awaitable<void> EtcdClient::lease_revoke(int64_t id, Deadline deadline) {
  json body = {{"ID", std::to_string(id)}};
  std::string path = "/v3/lease/revoke";
  try {
    co_await impl_->call(std::move(path), body.dump(), deadline);
  } catch (const EtcdError& e) {
    if (e.kind() != Kind::kRequest ||
        std::string(e.what()).find("not found") == std::string::npos) {
      throw;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// EtcdWatch

class EtcdWatch::Impl : public MemberLink, public std::enable_shared_from_this<EtcdWatch::Impl> {
 public:
  using MemberLink::MemberLink;

  asio::awaitable<void> start(std::string key, std::string range_end, int64_t start_revision,
                              Deadline deadline) {
    auto self = shared_from_this();
    json create = {{"key", base64_encode(key)}, {"start_revision", std::to_string(start_revision)}};
    if (!range_end.empty()) create["range_end"] = base64_encode(range_end);
    const std::string body = json{{"create_request", create}}.dump();
    for (;;) {
      drop();
      if (closed_) throw EtcdError(Kind::kClosed, "etcd watch closed");
      const auto now = Clock::now();
      if (now >= deadline) throw EtcdError(Kind::kUnavailable, members_.unavailable());
      const Deadline attempt = std::min(deadline, now + o_.attempt_timeout);
      const size_t used = members_.index();
      std::string failure;
      try {
        conn_ = std::make_unique<Connection>(ex_, o_, members_.current(), ctx_.get(), used);
        co_await conn_->open(attempt);
        conn_->lowest().expires_at(attempt);
        auto req = conn_->request("/v3/watch", body);
        // A watch on a member cut off from its leader would wait for events that never come:
        // ask etcd to end it instead (then the next member is tried).
        req.set("Grpc-Metadata-hasleader", "true");
        co_await conn_->write(req);
        parser_.emplace();
        parser_->body_limit(boost::none);
        co_await conn_->read_header(*parser_);
        const unsigned status = parser_->get().result_int();
        if (status != 200) {
          failure = "watch: HTTP " + std::to_string(status);
        } else {
          members_.succeeded();
          co_return;
        }
      } catch (const EtcdError&) {
        throw;
      } catch (const boost::system::system_error& e) {
        failure = attempt_failure(e, conn_.get(), closed_);
      }
      drop();
      co_await members_.failed(failure, deadline, used);
    }
  }

  asio::awaitable<std::optional<std::vector<WatchEvent>>> next(Deadline deadline) {
    auto self = shared_from_this();
    for (;;) {
      if (closed_) throw EtcdError(Kind::kClosed, "etcd watch closed");
      if (!conn_) throw EtcdError(Kind::kUnavailable, "etcd watch not started");
      if (size_t nl = pending_.find('\n'); nl != std::string::npos) {
        std::string line = pending_.substr(0, nl);
        pending_.erase(0, nl + 1);
        if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
        auto events = parse(line);
        if (!events.empty()) co_return events;
        continue;
      }
      if (pending_.size() > o_.max_reply_bytes) {
        drop();
        throw EtcdError(Kind::kUnavailable, "etcd watch: a message over the size limit");
      }
      char chunk[16384];
      parser_->get().body().data = chunk;
      parser_->get().body().size = sizeof chunk;
      if (deadline == kNoDeadline) {
        conn_->lowest().expires_never();  // the far end of steady_clock overflows the timer
      } else {
        conn_->lowest().expires_at(deadline);
      }
      auto ec = co_await conn_->read_some(*parser_);
      const size_t got = sizeof chunk - parser_->get().body().size;
      pending_.append(chunk, got);
      if (ec == http::error::need_buffer) ec = {};
      if (closed_) throw EtcdError(Kind::kClosed, "etcd watch closed");
      if (ec == beast::error::timeout && Clock::now() >= deadline) {
        drop();
        co_return std::nullopt;
      }
      if (ec) {
        drop();
        throw EtcdError(Kind::kUnavailable, "etcd watch lost: " + ec.message());
      }
      if (parser_->is_done() && pending_.find('\n') == std::string::npos) {
        if (!pending_.empty())
          pending_ += '\n';  // a last message without its newline
        else {
          drop();
          throw EtcdError(Kind::kUnavailable, "etcd ended the watch");
        }
      }
    }
  }

  std::vector<WatchEvent> parse(const std::string& line) {
    std::vector<WatchEvent> out;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      drop();
      throw EtcdError(Kind::kUnavailable,
                      std::string("etcd watch: malformed message: ") + e.what());
    }
    if (j.contains("error")) {
      ErrorReply e = error_of(line);
      drop();
      throw EtcdError(Kind::kUnavailable, "etcd watch ended: " + e.message);
    }
    const json& r = j.contains("result") ? j["result"] : j;
    if (r.value("canceled", false)) {
      const int64_t compact = i64(r, "compact_revision");
      drop();
      if (compact) {
        throw EtcdError(Kind::kCompacted,
                        "etcd compacted the history to revision " + std::to_string(compact));
      }
      throw EtcdError(Kind::kUnavailable,
                      "etcd canceled the watch: " + r.value("cancel_reason", std::string()));
    }
    if (r.contains("events")) {
      try {
        for (const auto& ev : r["events"]) {
          WatchEvent w;
          w.deleted = ev.value("type", std::string("PUT")) == "DELETE";
          w.kv = kv_from(ev.value("kv", json::object()));
          out.push_back(std::move(w));
        }
      } catch (const std::exception& e) {
        drop();
        throw EtcdError(Kind::kUnavailable,
                        std::string("etcd watch: malformed event: ") + e.what());
      }
    }
    return out;
  }

  void drop() {
    if (conn_) conn_->close();
    conn_.reset();
    parser_.reset();
    pending_.clear();
  }

  std::optional<http::response_parser<http::buffer_body>> parser_;
  std::string pending_;
};

EtcdWatch::EtcdWatch(asio::any_io_executor executor, Options options)
    : impl_(std::make_shared<Impl>(std::move(executor), std::move(options))) {}
EtcdWatch::~EtcdWatch() {
  impl_->close();
}
void EtcdWatch::close() {
  impl_->close();
}

asio::awaitable<void> EtcdWatch::start(std::string key, std::string range_end,
                                       int64_t start_revision, Deadline deadline) {
  auto impl = impl_;
  co_await impl->start(std::move(key), std::move(range_end), start_revision, deadline);
}

asio::awaitable<std::optional<std::vector<WatchEvent>>> EtcdWatch::next(Deadline deadline) {
  auto impl = impl_;
  co_return co_await impl->next(deadline);
}

}  // namespace ddprun::etcd
