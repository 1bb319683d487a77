// LocalClient (proxy_client.hpp): one worker's connection to the store proxy.
#include "store/proxy_client.hpp"

#include <boost/asio/buffer.hpp>
#include <boost/asio/write.hpp>
#include <utility>

namespace ddprun::store::proxy {

namespace asio = boost::asio;

namespace {

// Requests parsed but not yet issued, per client: a client this far ahead of its replies is
// not a torch client (they wait for each reply); it is closed.
constexpr size_t kMaxQueued = 1 << 16;

}  // namespace

void Slot::fill(std::string_view reply) {
  if (ready) return;
  bytes.assign(reply);
  ready = true;
  if (auto owner = client.lock()) owner->send_ready();
}

LocalClient::LocalClient(asio::ip::tcp::socket socket, const Limits& limits, std::string peer)
    : socket_(std::move(socket)), parser_(limits), peer_(std::move(peer)) {}

void LocalClient::start(Issue issue, Closed closed) {
  issue_ = std::move(issue);
  closed_callback_ = std::move(closed);
  read();
}

void LocalClient::read() {
  socket_.async_read_some(
      asio::buffer(in_), [self = shared_from_this()](boost::system::error_code ec, size_t n) {
        if (self->closed_) return;
        if (ec) return self->close("");
        std::string_view data(self->in_.data(), n);
        while (!data.empty() && !self->closed_) {
          data.remove_prefix(self->parser_.feed(data));
          if (self->parser_.failed()) return self->close(self->parser_.error());
          if (!self->parser_.ready()) continue;
          Request request = self->parser_.take();
          // The rules a store applies the moment a request arrives, before anything queued:
          // 1.13 sends nothing while it waits unless it gave up; 2.x's CANCEL_WAIT right behind
          // its WAIT cancels it even while that WAIT waits to be sent.
          const bool gave_up = self->dialect() == Dialect::kTorch1 ||
                               (request.op == Op::kCancelWait && self->queued_.empty());
          if (self->wait_ && gave_up) {
            PendingWait wait = std::move(*self->wait_);
            self->wait_.reset();
            wait.cancel();
            wait.slot->drop();
          }
          if (self->queued_.size() >= kMaxQueued) {
            return self->close("over " + std::to_string(kMaxQueued) + " requests queued");
          }
          self->queued_.push_back(std::move(request));
        }
        self->issue_queued();
        if (!self->closed_) self->read();
      });
}

void LocalClient::issue_queued() {
  if (issuing_) return;  // an issue that unblocks this client, from inside issue_
  issuing_ = true;
  while (!blocked_ && !closed_ && !queued_.empty()) {
    Request request = std::move(queued_.front());
    queued_.pop_front();
    issue_(*this, request);
  }
  issuing_ = false;
}

void LocalClient::unblock() {
  blocked_ = false;
  issue_queued();
}

std::shared_ptr<Slot> LocalClient::owe() {
  auto slot = std::make_shared<Slot>();
  slot->client = weak_from_this();
  owed_.push_back(slot);
  return slot;
}

void LocalClient::send_ready() {
  while (!owed_.empty() && owed_.front()->ready) {
    out_ += owed_.front()->bytes;
    owed_.pop_front();
  }
  write();
}

void LocalClient::write() {
  if (writing_now_ || out_.empty() || closed_) return;
  writing_now_ = true;
  writing_.swap(out_);
  asio::async_write(socket_, asio::buffer(writing_),
                    [self = shared_from_this()](boost::system::error_code ec, size_t) {
                      self->writing_now_ = false;
                      self->writing_.clear();
                      if (ec) return self->close("");
                      self->write();
                    });
}

void LocalClient::close(const std::string& why) {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  socket_.close(ignored);
  queued_.clear();
  owed_.clear();
  if (wait_) {
    PendingWait wait = std::move(*wait_);
    wait_.reset();
    wait.cancel();
  }
  if (closed_callback_) closed_callback_(*this, why);
}

}  // namespace ddprun::store::proxy
