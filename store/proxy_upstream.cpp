// Upstream (proxy_upstream.hpp): the proxy's multiplexed connection to the job's store.
#include "store/proxy_upstream.hpp"

#include <algorithm>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/system/system_error.hpp>
#include <memory>
#include <stdexcept>
#include <utility>

#include "store/async_client.hpp"
#include "store/client_frames.hpp"
#include "store/sys/log.hpp"
#include "store/wire.hpp"

namespace ddprun::store::proxy {

namespace asio = boost::asio;

namespace {

// A length-prefixed field at `at`: its end, or 0 while incomplete.
size_t field_end(std::string_view in, size_t at) {
  if (in.size() < at + 8) return 0;
  const uint64_t n = wire::load_le(in.data() + at, 8);
  if (n > client_frames::kMaxReplyBytes) throw std::length_error("a reply field too long");
  return in.size() < at + 8 + n ? 0 : at + 8 + n;
}

}  // namespace

size_t reply_length(Shape shape, size_t count, std::string_view in) {
  switch (shape) {
    case Shape::kU8:
      return in.empty() ? 0 : 1;
    case Shape::kI64:
      return in.size() < 8 ? 0 : 8;
    case Shape::kBytes:
      return field_end(in, 0);
    case Shape::kValues:
      break;
    case Shape::kQueuePop: {
      if (in.size() < 8) return 0;
      const auto length = static_cast<int64_t>(wire::load_le(in.data(), 8));
      return length > 0 ? field_end(in, 8) : 8;
    }
    case Shape::kListKeys: {
      if (in.size() < 8) return 0;
      count = wire::load_le(in.data(), 8);
      if (count > client_frames::kMaxReplyBytes / 8) throw std::length_error("too many keys");
      size_t at = 8;
      for (size_t i = 0; i < count; ++i) {
        at = field_end(in, at);
        if (at == 0) return 0;
      }
      return at;
    }
  }
  size_t at = 0;
  for (size_t i = 0; i < count; ++i) {
    at = field_end(in, at);
    if (at == 0) return 0;
  }
  return at;
}

Upstream::Upstream(asio::any_io_executor executor, const ProxyOptions& options, Handlers handlers)
    : executor_(executor),
      options_(options),
      handlers_(std::move(handlers)),
      socket_(executor),
      chunk_(std::make_unique<char[]>(kReadChunk)) {}

namespace {

// Past these, the proxy asks the store what it has (MUX_SYNC), so neither side keeps more than
// about this much for a resume.
constexpr uint64_t kSyncReceived = 32 << 10;
constexpr size_t kSyncSent = 256 << 10;

// The store answered a resume with kMuxUnknownSession: trying again cannot help.
struct SessionGone : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

// The first connection gets the same retries as a resume: a connection that breaks during the
// MUX handshake (a reset, the store's host busy) is tried again within the connect timeout.
void Upstream::start() {
  asio::co_spawn(executor_, resume(),
                 asio::bind_cancellation_slot(cancel_.slot(),
                                              [self = shared_from_this()](std::exception_ptr e) {
                                                if (!e) return;
                                                try {
                                                  std::rethrow_exception(e);
                                                } catch (const std::exception& error) {
                                                  self->fail(error.what());
                                                }
                                              }));
}

asio::awaitable<void> Upstream::connect(std::chrono::milliseconds budget) {
  const auto deadline = std::chrono::steady_clock::now() + budget;
  ClientOptions options = options_.upstream;
  options.connect_timeout = budget;
  auto client = co_await AsyncClient::connect(executor_, options_.upstream_host,
                                              options_.upstream_port, options);
  if (closed_) co_return;
  socket_ = client->release_socket();
  // The session's handshake gets what is left of the budget: a store that answers the hello
  // but never the MUX ends this attempt (its socket closed) instead of holding the proxy.
  asio::steady_timer limit(executor_, deadline);
  limit.async_wait([self = shared_from_this(), gen = generation_](boost::system::error_code ec) {
    if (ec || gen != self->generation_ || self->connected_) return;
    boost::system::error_code ignored;
    self->socket_.close(ignored);
  });
  std::string mux;
  wire::put_u8(mux, kMuxOpcode);
  wire::put_i64(mux, static_cast<int64_t>(session_));
  wire::put_i64(mux, static_cast<int64_t>(in_total_));
  char ack[17];
  try {
    co_await asio::async_write(socket_, asio::buffer(mux), asio::use_awaitable);
    co_await asio::async_read(socket_, asio::buffer(ack, 1), asio::use_awaitable);
    if (static_cast<uint8_t>(ack[0]) == kMuxUnknownSession) {
      throw SessionGone("the store no longer has this proxy's session");
    }
    co_await asio::async_read(socket_, asio::buffer(ack + 1, 16), asio::use_awaitable);
  } catch (const boost::system::system_error&) {
    if (std::chrono::steady_clock::now() < deadline) throw;  // not the timer's doing
    throw std::runtime_error("the store did not answer MUX within the connect timeout");
  }
  if (closed_) co_return;
  const auto id = wire::load_le(ack + 1, 8);
  const uint64_t consumed = wire::load_le(ack + 9, 8);
  if (static_cast<uint8_t>(ack[0]) != kExtensionAck || (session_ != 0 && id != session_)) {
    throw std::runtime_error("the store did not accept MUX");
  }
  if (consumed < sent_base_ || consumed > sent_base_ + sent_.size()) {
    throw std::runtime_error("the store resumed from a position this proxy never sent");
  }
  if (session_ != 0) ++resumes_;
  session_ = id;
  // What the store does not have goes again, then what was never written.
  out_.insert(0, sent_, static_cast<size_t>(consumed - sent_base_));
  sent_.clear();
  sent_base_ = consumed;
  connected_ = true;
  if (resumes_ == 0 && handlers_.connected) handlers_.connected();
  read();
  flush();
}

void Upstream::close() {
  closed_ = true;
  cancel_.emit(asio::cancellation_type::all);  // a connect or resume in progress ends now
  boost::system::error_code ignored;
  socket_.close(ignored);
}

void Upstream::send(std::string frame, Shape shape, size_t count, Reply reply) {
  expected_.push_back(Expected{shape, count, std::move(reply)});
  send(std::move(frame));
}

void Upstream::send(std::string frame) {
  ++requests_;
  out_ += frame;
}

void Upstream::sync_if_due() {
  if (sync_pending_ || (in_total_ - synced_in_ < kSyncReceived && sent_.size() < kSyncSent)) {
    return;
  }
  sync_pending_ = true;
  synced_in_ = in_total_;
  std::string frame;
  wire::put_u8(frame, kMuxSyncOpcode);
  wire::put_i64(frame, static_cast<int64_t>(in_total_));
  out_ += frame;
  expected_.push_back(Expected{Shape::kI64, 0, [this](std::string_view reply, bool) {
                                 sync_pending_ = false;
                                 const uint64_t consumed = wire::load_le(reply.data(), 8);
                                 if (consumed <= sent_base_) return;
                                 const size_t n = static_cast<size_t>(
                                     std::min<uint64_t>(consumed - sent_base_, sent_.size()));
                                 sent_.erase(0, n);
                                 sent_base_ += n;
                               }});
}

void Upstream::flush() {
  if (!connected_ || closed_ || writing_now_) return;
  sync_if_due();
  if (out_.empty()) return;
  writing_now_ = true;
  auto buffer = std::make_shared<std::string>(std::move(out_));
  out_.clear();
  sent_ += *buffer;
  asio::async_write(
      socket_, asio::buffer(*buffer),
      [self = shared_from_this(), buffer, gen = generation_](boost::system::error_code ec, size_t) {
        if (gen != self->generation_) return;  // that connection broke
        self->writing_now_ = false;
        if (ec) return self->broken("writing to the store: " + ec.message());
        self->flush();
      });
}

// Reads into a buffer of its own, not into in_'s tail: a read of a connection that broke (its
// write failed first) ends without data, and nothing of it may stay in in_ for the next
// connection's bytes to follow (zeros there parse as replies).
void Upstream::read() {
  socket_.async_read_some(
      asio::buffer(chunk_.get(), kReadChunk),
      [self = shared_from_this(), gen = generation_](boost::system::error_code ec, size_t n) {
        if (gen != self->generation_) return;
        self->in_.append(self->chunk_.get(), n);
        self->in_total_ += n;
        if (ec) {
          return self->broken(ec == asio::error::eof ? "the store closed the connection"
                                                     : "reading from the store: " + ec.message());
        }
        if (!self->parse()) return;
        self->read();
      });
}

bool Upstream::parse() {
  size_t at = 0;
  try {
    while (at < in_.size() && !closed_) {
      const std::string_view rest = std::string_view(in_).substr(at);
      const auto frame = static_cast<uint8_t>(rest[0]);
      if (frame == kMuxRelease) {
        if (rest.size() < 5) break;
        at += 5;
        handlers_.released(static_cast<uint32_t>(wire::load_le(rest.data() + 1, 4)));
      } else if (frame == kMuxTagFailed) {
        const size_t end = rest.size() < 5 ? 0 : field_end(rest, 5);
        if (end == 0) break;
        at += end;
        handlers_.tag_failed(static_cast<uint32_t>(wire::load_le(rest.data() + 1, 4)),
                             std::string(rest.substr(13, end - 13)));
      } else if (frame == kMuxReply || frame == kMuxFailed) {
        if (expected_.empty()) throw std::length_error("a reply nobody asked for");
        const Expected& e = expected_.front();
        const size_t end = frame == kMuxReply ? reply_length(e.shape, e.count, rest.substr(1))
                                              : field_end(rest, 1);
        if (end == 0) break;
        Reply reply = std::move(expected_.front().reply);
        expected_.pop_front();
        if (frame == kMuxReply) {
          at += 1 + end;
          reply(rest.substr(1, end), false);
        } else {
          at += end;
          reply(rest.substr(9, end - 9), true);
        }
      } else {
        throw std::length_error("an unknown frame byte");
      }
    }
  } catch (const std::length_error& e) {
    fail(std::string("malformed reply from the store: ") + e.what());
    return false;
  }
  in_.erase(0, at);
  return !closed_;
}

void Upstream::fail(const std::string& why) {
  if (closed_) return;
  close();
  connected_ = false;
  if (handlers_.lost) handlers_.lost(why);
}

// Connects (again) and opens (resumes) the session, attempt after attempt (a connection may
// break during the handshake too), until the client's connect timeout has passed or the store
// says the session is gone.
asio::awaitable<void> Upstream::resume() {
  const auto deadline = std::chrono::steady_clock::now() + options_.upstream.connect_timeout;
  asio::steady_timer pause(executor_);
  std::string last = "the connect timeout is 0";
  for (auto backoff = std::chrono::milliseconds(10);;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw std::runtime_error(last);  // the last attempt's reason
    try {
      co_await connect(left);
      co_return;
    } catch (const SessionGone&) {
      throw;
    } catch (const std::exception& e) {
      const auto* refused = dynamic_cast<const StoreError*>(&e);
      if (refused && refused->kind() == StoreError::Kind::kAuth) throw;  // retrying cannot help
      if (closed_ || std::chrono::steady_clock::now() >= deadline) throw;
      last = e.what();
    }
    boost::system::error_code ignored;
    socket_.close(ignored);
    pause.expires_after(backoff);
    co_await pause.async_wait(asio::use_awaitable);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    if (closed_) co_return;
  }
}

// The connection broke (a reset, the store's end closed, a network fault): a session the store
// knows is resumed on a new connection; the first connection's loss is final.
void Upstream::broken(const std::string& why) {
  if (closed_) return;
  if (session_ == 0) return fail(why);
  ++generation_;
  connected_ = false;
  writing_now_ = false;
  boost::system::error_code ignored;
  socket_.close(ignored);
  sys::log_line(options_.log_prefix, "link to the store broke (" + why + "): resuming");
  asio::co_spawn(executor_, resume(),
                 asio::bind_cancellation_slot(
                     cancel_.slot(), [self = shared_from_this(), why](std::exception_ptr e) {
                       if (!e) return;
                       try {
                         std::rethrow_exception(e);
                       } catch (const std::exception& error) {
                         self->fail(why + "; resuming failed: " + error.what());
                       }
                     }));
}

}  // namespace ddprun::store::proxy
