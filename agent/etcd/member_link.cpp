#include "agent/etcd/member_link.hpp"

#include <algorithm>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdio>
#include <stdexcept>

#include "store/sys/net.hpp"

namespace ddprun::etcd::detail {

Members::Members(asio::any_io_executor ex, const Options& o)
    : o_(o), at_(o.cursor ? o.cursor : std::make_shared<size_t>(0)), timer_(ex) {
  if (o_.endpoints.empty()) throw std::invalid_argument("etcd: no endpoints");
}

asio::awaitable<void> Members::failed(const std::string& what, Deadline deadline, size_t used) {
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
  co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

void Members::succeeded() {
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

std::string Members::unavailable() const {
  std::string hint;
  if (!o_.tls && last_error_.find("end of stream") != std::string::npos) {
    hint = " (if etcd serves TLS: --rdzv-conf protocol=https,cacert=PATH)";
  }
  return "no etcd member answered (" + endpoints_text(o_.endpoints) + ")" +
         (last_error_.empty() ? "" : ": last error: " + last_error_) + hint;
}

MemberLink::MemberLink(asio::any_io_executor ex, Options o)
    : ex_(std::move(ex)), o_(std::move(o)), ctx_(make_tls_context(o_)), members_(ex_, o_) {}

void MemberLink::close() {
  closed_ = true;
  members_.cancel();
  if (conn_) conn_->close();
}

}  // namespace ddprun::etcd::detail
