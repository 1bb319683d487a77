// StoreProxy's implementation (proxy.hpp), shared by proxy.cpp (clients, the lanes'
// bookkeeping), proxy_requests.cpp (what each request becomes) and proxy_lanes.cpp (sending a
// lane's group and answering its members).
// Internal to store/.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "store/proxy.hpp"
#include "store/proxy_client.hpp"
#include "store/proxy_upstream.hpp"

namespace ddprun::store {

namespace proxy {
// A request in the 2.x numbering, its fields as the store expects them (op_spec).
std::string encode(const Request& r);
}  // namespace proxy

class StoreProxy::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(boost::asio::io_context& io, ProxyOptions options);  // binds (throws like StoreProxy)

  void start();
  void close(const std::string& why);
  uint16_t port() const { return port_; }
  ProxyStats stats() const;
  std::function<void(const std::string&)> lost_callback;

 private:
  // SETs gather in one lane (""), sent as one MULTI_SET; the GET groups sent in one turn go as
  // one MULTI_GET, its WAIT groups as one MULTI_WAIT_TAGGED.
  enum Kind { kAdd, kGet, kWait, kSet, kKinds };
  struct Member {
    std::shared_ptr<proxy::Slot> slot;
    std::weak_ptr<proxy::LocalClient> client;
    int64_t delta = 0;
  };
  struct Group {
    std::vector<Member> members;
    std::vector<std::string> keys;    // as the first member asked (all members ask the same);
                                      // kSet: each member's key
    std::vector<std::string> values;  // kSet: each member's value
  };
  struct Lane {
    std::shared_ptr<Group> in_flight;  // sent, not answered
    std::shared_ptr<Group> next;       // gathering
  };
  // What a tag of this proxy's upstream link stands for: a WAIT lane's group, or one BARRIER.
  struct Tagged {
    std::string lane;  // a WAIT lane, empty for a BARRIER
    std::shared_ptr<Group> group;
  };

  void accept();
  void issue(proxy::LocalClient& client, Request& request);
  // The requests the proxy answers itself (VALIDATE, PING, AUTH, ...): true when `request` was one.
  bool answer_here(proxy::LocalClient& client, Request& request);
  void pass_through(proxy::LocalClient& client, Request& request);
  void join(Kind kind, std::string lane, proxy::LocalClient& client, Request& request);
  void cancel_wait(const std::string& lane, const std::shared_ptr<proxy::Slot>& slot);
  void barrier(proxy::LocalClient& client, Request& request);
  void schedule_flush();
  void flush();
  void emit(Kind kind, const std::string& lane);
  // The lane's gathered group, now in flight; null when it has none or one is in flight.
  std::shared_ptr<Group> take_next(Kind kind, const std::string& lane);
  void emit_gets(std::vector<std::pair<std::string, std::shared_ptr<Group>>> gets);
  void emit_waits(std::vector<std::pair<std::string, std::shared_ptr<Group>>> waits);
  void unblock(const Group& group);
  void emit_add(const std::string& lane, const std::shared_ptr<Group>& group);
  void add_replied(const std::string& lane, const std::shared_ptr<Group>& group, int64_t sum,
                   std::string_view reply, bool failed);
  void released(uint32_t tag);
  void finished(Kind kind, const std::string& lane, const std::shared_ptr<Group>& group);
  void client_closed(proxy::LocalClient& client, const std::string& why);

  boost::asio::io_context& io_;
  ProxyOptions options_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::shared_ptr<proxy::Upstream> upstream_;
  std::unordered_set<std::shared_ptr<proxy::LocalClient>> clients_;
  std::unordered_map<std::string, Lane> lanes_[kKinds];
  std::vector<std::pair<Kind, std::string>> dirty_;  // lanes that may send their next group
  std::unordered_map<uint32_t, Tagged> tagged_;
  uint32_t next_tag_ = 1;
  boost::asio::steady_timer gather_timer_;  // ProxyOptions::gather
  bool flush_posted_ = false;
  bool closed_ = false;
  ProxyStats stats_;
};

}  // namespace ddprun::store
