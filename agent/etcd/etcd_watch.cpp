#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "agent/etcd/connection.hpp"
#include "agent/etcd/etcd_client.hpp"
#include "agent/etcd/gateway.hpp"
#include "agent/etcd/member_link.hpp"

namespace ddprun::etcd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using detail::attempt_failure;
using detail::Connection;
using detail::error_of;
using detail::ErrorReply;
using detail::i64;
using detail::json;
using detail::kv_from;
using detail::MemberLink;
using Kind = EtcdError::Kind;

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
