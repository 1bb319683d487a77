#include "agent/etcd/connection.hpp"

#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include <boost/asio/ip/address.hpp>

#include "store/socket_io.hpp"
#include "store/sys/net.hpp"

namespace ddprun::etcd::detail {

using asio::use_awaitable;
using Kind = EtcdError::Kind;

bool is_tls_failure(const boost::system::error_code& ec) {
  return ec.category() == asio::error::get_ssl_category() &&
         ec != asio::ssl::error::stream_truncated;
}

Connection::Connection(asio::any_io_executor ex, const Options& o, const Endpoint& ep,
                       ssl::context* ctx, size_t index)
    : ex_(std::move(ex)), o_(o), ep_(ep), index_(index) {
  if (ctx) {
    tls_.emplace(ex_, *ctx);
  } else {
    tcp_.emplace(ex_);
  }
}

std::string Connection::name() const {
  return sys::endpoint_text(ep_.host, ep_.port);
}

void Connection::close() {
  boost::system::error_code ec;
  lowest().socket().close(ec);
}

asio::awaitable<void> Connection::open(Deadline deadline) {
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

std::string Connection::tls_failure(const boost::system::error_code& ec) {
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

asio::awaitable<void> Connection::write(http::request<http::string_body>& req) {
  if (tls_) {
    co_await http::async_write(*tls_, req, use_awaitable);
  } else {
    co_await http::async_write(*tcp_, req, use_awaitable);
  }
}

http::request<http::string_body> Connection::request(const std::string& path,
                                                     std::string body) const {
  http::request<http::string_body> req{http::verb::post, path, 11};
  req.set(http::field::host, name());
  req.set(http::field::content_type, "application/json");
  req.set(http::field::user_agent, "ddprun");
  req.keep_alive(true);
  req.body() = std::move(body);
  req.prepare_payload();
  return req;
}

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

}  // namespace ddprun::etcd::detail
