// StoreProxy (proxy.hpp): its clients, and the lanes where requests that can be asked once for
// many clients (ADD, GET, WAIT of the same key or keys) gather, one lane per key; what each
// request becomes is in proxy_requests.cpp.
#include "store/proxy.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <future>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "store/proxy_impl.hpp"
#include "store/sys/acceptor.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"
#include "store/wire.hpp"

namespace ddprun::store {

namespace asio = boost::asio;
using asio::ip::tcp;
using proxy::LocalClient;
using proxy::Shape;
using proxy::Slot;
using proxy::Upstream;

StoreProxy::Impl::Impl(asio::io_context& io, ProxyOptions options)
    : io_(io), options_(std::move(options)), acceptor_(io), gather_timer_(io) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(options_.listen_host, ec);
  if (ec) throw std::system_error(ec, "store proxy: bad listen address " + options_.listen_host);
  sys::open_listener(
      acceptor_, tcp::endpoint(address, options_.listen_port), 128,
      "cannot listen on " + sys::endpoint_text(options_.listen_host, options_.listen_port));
  port_ = acceptor_.local_endpoint().port();
}

ProxyStats StoreProxy::Impl::stats() const {
  ProxyStats s = stats_;
  s.upstream_requests = upstream_ ? upstream_->requests() : 0;
  s.upstream_connected = upstream_ && upstream_->connected();
  s.resumes = upstream_ ? upstream_->resumes() : 0;
  return s;
}

void StoreProxy::Impl::start() {
  std::weak_ptr<Impl> weak = weak_from_this();
  Upstream::Handlers handlers;
  handlers.released = [weak](uint32_t tag) {
    if (auto self = weak.lock()) self->released(tag);
  };
  handlers.tag_failed = [weak](uint32_t tag, const std::string& why) {
    auto self = weak.lock();
    if (!self) return;
    auto it = self->tagged_.find(tag);
    if (it == self->tagged_.end()) return;
    const std::shared_ptr<Group> group = it->second.group;
    self->tagged_.erase(it);
    for (const Member& m : group->members) {
      if (auto c = m.client.lock()) c->close(why);
    }
  };
  handlers.lost = [weak](const std::string& why) {
    if (auto self = weak.lock()) self->close("lost the store: " + why);
  };
  upstream_ = std::make_shared<Upstream>(io_.get_executor(), options_, std::move(handlers));
  upstream_->start();
  accept();
}

void StoreProxy::Impl::accept() {
  acceptor_.async_accept(
      [self = shared_from_this()](boost::system::error_code ec, tcp::socket socket) {
        if (self->closed_) return;
        if (!ec) {
          boost::system::error_code peer_ec;
          const tcp::endpoint peer = socket.remote_endpoint(peer_ec);
          if (!peer_ec && peer.address().is_loopback()) {
            socket.set_option(tcp::no_delay(true), peer_ec);
            auto client = std::make_shared<LocalClient>(
                std::move(socket), self->options_.limits,
                sys::endpoint_text(peer.address().to_string(), peer.port()));
            self->clients_.insert(client);
            ++self->stats_.clients;
            std::weak_ptr<Impl> weak = self;
            client->start(
                [weak](LocalClient& c, Request& r) {
                  if (auto s = weak.lock()) s->issue(c, r);
                },
                [weak](LocalClient& c, const std::string& why) {
                  if (auto s = weak.lock()) s->client_closed(c, why);
                });
          }
        }
        self->accept();
      });
}

void StoreProxy::Impl::join(Kind kind, std::string lane_key, LocalClient& c, Request& r) {
  Lane& lane = lanes_[kind][lane_key];
  if (!lane.next) {
    lane.next = std::make_shared<Group>();
    if (kind != kSet) lane.next->keys = r.keys;
  }
  if (kind == kSet) {
    lane.next->keys.push_back(std::move(r.keys[0]));
    lane.next->values.push_back(std::move(r.values[0]));
  }
  Member m{kind == kSet ? nullptr : c.owe(), c.weak_from_this(), r.integer};
  if (kind == kWait) {
    c.pending_wait() =
        LocalClient::PendingWait{m.slot, [self = weak_from_this(), lane_key, slot = m.slot] {
                                   if (auto s = self.lock()) s->cancel_wait(lane_key, slot);
                                 }};
  }
  lane.next->members.push_back(std::move(m));
  c.block();
  if (!lane.in_flight) dirty_.emplace_back(kind, std::move(lane_key));
  schedule_flush();
}

void StoreProxy::Impl::cancel_wait(const std::string& lane_key, const std::shared_ptr<Slot>& slot) {
  auto it = lanes_[kWait].find(lane_key);
  if (it == lanes_[kWait].end()) return;
  Lane& lane = it->second;
  auto remove = [&slot](Group& g) {
    for (auto m = g.members.begin(); m != g.members.end(); ++m) {
      if (m->slot != slot) continue;
      std::weak_ptr<LocalClient> client = m->client;
      g.members.erase(m);
      return client;
    }
    return std::weak_ptr<LocalClient>();
  };
  if (lane.next) {
    if (auto client = remove(*lane.next).lock()) {
      if (lane.next->members.empty()) lane.next.reset();
      client->unblock();
      return;
    }
  }
  if (lane.in_flight && remove(*lane.in_flight).lock() && lane.in_flight->members.empty()) {
    const std::shared_ptr<Group> group = lane.in_flight;
    // Nobody waits for it any more: take it back from the store (its release, if already on
    // the way, finds no tag and is dropped).
    for (auto t = tagged_.begin(); t != tagged_.end(); ++t) {
      if (t->second.group != group) continue;
      std::string frame;
      wire::put_u8(frame, kCancelTaggedOpcode);
      wire::put_u32(frame, t->first);
      upstream_->send(std::move(frame), Shape::kU8, 0, [](std::string_view, bool) {});
      tagged_.erase(t);
      break;
    }
    finished(kWait, lane_key, group);
    schedule_flush();
  }
}

void StoreProxy::Impl::barrier(LocalClient& c, Request& r) {
  const uint32_t tag = next_tag_++;
  auto group = std::make_shared<Group>();
  group->members.push_back(Member{c.owe(), c.weak_from_this(), 0});
  tagged_[tag] = Tagged{std::string(), group};
  c.pending_wait() = LocalClient::PendingWait{
      group->members[0].slot, [self = weak_from_this(), tag] {
        auto s = self.lock();
        if (!s || s->tagged_.erase(tag) == 0) return;
        std::string frame;
        wire::put_u8(frame, kCancelTaggedOpcode);
        wire::put_u32(frame, tag);
        s->upstream_->send(std::move(frame), Shape::kU8, 0, [](std::string_view, bool) {});
        s->schedule_flush();
      }};
  std::string frame;
  wire::put_u8(frame, kBarrierTaggedOpcode);
  wire::put_u32(frame, tag);
  wire::put_bytes(frame, r.keys[0]);
  wire::put_i64(frame, r.integer);
  upstream_->send(std::move(frame));
  schedule_flush();
}

void StoreProxy::Impl::schedule_flush() {
  if (flush_posted_ || closed_) return;
  flush_posted_ = true;
  if (options_.gather.count() == 0) {
    asio::post(io_, [self = shared_from_this()] { self->flush(); });
    return;
  }
  gather_timer_.expires_after(options_.gather);
  gather_timer_.async_wait(
      [self = shared_from_this()](boost::system::error_code) { self->flush(); });
}

// End of a turn: every lane with a gathered group and nothing in flight sends it; the clients
// this unblocks may gather more; then one write upstream for all of it.
void StoreProxy::Impl::flush() {
  flush_posted_ = false;
  if (closed_) return;
  while (!dirty_.empty()) {
    std::vector<std::pair<Kind, std::string>> lanes;
    lanes.swap(dirty_);
    std::vector<std::pair<std::string, std::shared_ptr<Group>>> gets, waits;
    for (const auto& [kind, lane] : lanes) {
      if (kind != kGet && kind != kWait) {
        emit(kind, lane);
      } else if (auto group = take_next(kind, lane)) {
        (kind == kGet ? gets : waits).emplace_back(lane, std::move(group));
      }
    }
    if (!gets.empty()) emit_gets(std::move(gets));
    if (!waits.empty()) emit_waits(std::move(waits));
  }
  upstream_->flush();
}

void StoreProxy::Impl::client_closed(LocalClient& c, const std::string& why) {
  if (!why.empty()) sys::log_line(options_.log_prefix, "closing " + c.peer() + ": " + why);
  if (auto& will = c.will()) {
    Request r;
    r.op = Op::kCompareSet;
    r.keys = {will->key};
    r.values = {will->expected, will->desired};
    upstream_->send(proxy::encode(r), Shape::kBytes, 0, [](std::string_view, bool) {});
    schedule_flush();
  }
  clients_.erase(c.shared_from_this());
}

void StoreProxy::Impl::close(const std::string& why) {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  gather_timer_.cancel();
  if (upstream_) upstream_->close();
  auto clients = std::move(clients_);
  for (const auto& c : clients) c->close(why);
  if (!why.empty()) sys::log_line(options_.log_prefix, why);
  if (lost_callback && !why.empty()) lost_callback(why);
}

}  // namespace ddprun::store

namespace ddprun::store {

StoreProxy::StoreProxy(asio::io_context& io, ProxyOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {
  impl_->start();
}

StoreProxy::~StoreProxy() {
  impl_->close("");
}

uint16_t StoreProxy::port() const {
  return impl_->port();
}

void StoreProxy::close() {
  impl_->close("");
}

ProxyStats StoreProxy::stats() const {
  return impl_->stats();
}

void StoreProxy::on_upstream_lost(std::function<void(const std::string&)> callback) {
  impl_->lost_callback = std::move(callback);
}

// The thread runs until the destructor stops it, even once the proxy is closed (the store lost)
// and has nothing left to do: stats() posts to it.
ProxyThread::ProxyThread(ProxyOptions options)
    : io_(std::make_unique<asio::io_context>()), keep_(io_->get_executor()) {
  proxy_ = std::make_unique<StoreProxy>(*io_, std::move(options));
  port_ = proxy_->port();
  thread_ = std::thread([this] { io_->run(); });
}

ProxyThread::~ProxyThread() {
  asio::post(*io_, [this] {
    proxy_.reset();
    io_->stop();
  });
  thread_.join();
}

ProxyStats ProxyThread::stats() {
  std::promise<ProxyStats> result;
  asio::post(*io_, [&] { result.set_value(proxy_->stats()); });
  return result.get_future().get();
}

}  // namespace ddprun::store
