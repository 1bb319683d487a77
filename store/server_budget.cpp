// ServerCore's side of the output budget (output_budget.hpp): connections that wait for it,
// waking them when bytes come back, and closing the connections that hold budget without
// reading while others wait.
#include <boost/asio/post.hpp>
#include <chrono>
#include <string>

#include "store/connection.hpp"
#include "store/server_core.hpp"
#include "store/sys/log.hpp"

namespace ddprun::store::detail {

namespace asio = boost::asio;

namespace {

std::string mib(size_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

}  // namespace

void ServerCore::wait_for_budget(Connection& connection) {
  if (!connection.budget_waiting_) {
    if (budget_waiters.empty()) budget_returns_seen = budget.returns();
    connection.budget_waiting_ = true;
    budget_waiters.push_back(connection.shared_from_this());
  }
  arm_stall_check();
  const auto now = std::chrono::steady_clock::now();
  if (now - budget_logged < std::chrono::seconds(1)) {
    ++budget_waits_unlogged;
    return;
  }
  budget_logged = now;
  std::string line = "replies not yet read by their clients hold " + mib(budget.used()) + " of " +
                     mib(budget.limit()) +
                     " (the output budget, ddpstore --max-output-bytes): " + "not reading from " +
                     connection.peer() + " until clients read";
  if (budget_waits_unlogged > 0) {
    line +=
        " (" + std::to_string(budget_waits_unlogged) + " more such pause(s) since the last line)";
  }
  budget_waits_unlogged = 0;
  sys::log_line(options.log_prefix, line);
}

void ServerCore::wake_budget_waiters() {
  if (budget_waiters.empty() || budget.returns() == budget_returns_seen) return;
  budget_returns_seen = budget.returns();
  std::vector<std::weak_ptr<Connection>> waiters;
  waiters.swap(budget_waiters);
  for (auto& weak : waiters) {
    auto c = weak.lock();
    if (!c) continue;
    c->budget_waiting_ = false;
    asio::post(io, [c] {
      if (!c->closed_ && c->read_paused_) c->on_readable();
    });
  }
}

// While connections wait for budget, those that hold some and have not taken a byte of their
// replies for reply_stall_timeout are closed: a client that stopped reading must not keep the
// memory every other client needs. Nobody is closed while nobody waits.
void ServerCore::arm_stall_check() {
  if (stall_check_armed || closed) return;
  stall_check_armed = true;
  stall_timer.expires_after(options.reply_stall_timeout);
  stall_timer.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
    auto core = weak.lock();
    if (!core) return;
    core->stall_check_armed = false;
    if (!ec) core->close_stalled();
  });
}

void ServerCore::close_stalled() {
  std::erase_if(budget_waiters, [](const std::weak_ptr<Connection>& w) {
    auto c = w.lock();
    return !c || c->closed_;
  });
  if (budget_waiters.empty() || closed) return;
  const auto now = std::chrono::steady_clock::now();
  size_t closed_now = 0;
  size_t freed = 0;
  for (Connection* c = connections; c != nullptr; c = c->next_) {
    if (c->closed_ || c->session_->charged() == 0 || c->session_->output().empty()) continue;
    if (now - c->last_sent_ < options.reply_stall_timeout) continue;
    freed += c->session_->charged();
    ++closed_now;
    c->close();  // its budget comes back when it finishes (Connection::finish)
  }
  if (closed_now > 0) {
    sys::log_line(options.log_prefix,
                  "closed " + std::to_string(closed_now) + " connection(s) that read none of " +
                      mib(freed) + " of replies for " +
                      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                         options.reply_stall_timeout)
                                         .count()) +
                      " s while others waited for the output budget");
  }
  arm_stall_check();
}

}  // namespace ddprun::store::detail
