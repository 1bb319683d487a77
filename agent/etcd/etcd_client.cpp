#include "agent/etcd/etcd_client.hpp"

#include <algorithm>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstring>

#include "agent/etcd/connection.hpp"
#include "agent/etcd/gateway.hpp"
#include "agent/etcd/member_link.hpp"
#include "store/sys/net.hpp"

namespace ddprun::etcd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using detail::attempt_failure;
using detail::auth_failure;
using detail::compare_json;
using detail::Connection;
using detail::error_of;
using detail::ErrorReply;
using detail::i64;
using detail::json;
using detail::kv_from;
using detail::MemberLink;
using detail::op_json;
using detail::retryable;
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

// ---------------------------------------------------------------------------------------------
// EtcdClient

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
        if (!res.keep_alive()) conn_.reset();
        if (auto j = answer(res, path, failure)) co_return std::move(*j);
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

  // What the current member's reply to `path` says: its JSON (HTTP 200); the end of the
  // request (thrown: an authentication failure, or etcd's error about the request itself); or
  // nullopt, with `failure` saying why the next member is tried.
  std::optional<json> answer(const http::response<http::string_body>& res, const std::string& path,
                             std::string& failure) {
    const unsigned status = res.result_int();
    if (status == 200) {
      json j = json::parse(res.body());
      members_.succeeded();
      return j;
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
    return std::nullopt;
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

}  // namespace ddprun::etcd
