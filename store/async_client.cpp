// AsyncClient (async_client.hpp): connecting with jittered back-off, and each operation as one
// request frame and its reply on the AsyncChannel (async_channel.hpp).
#include "store/async_client.hpp"

#include <algorithm>
#include <boost/asio/this_coro.hpp>
#include <functional>
#include <random>
#include <stdexcept>
#include <type_traits>

#include "store/async_channel.hpp"
#include "store/client_frames.hpp"
#include "store/sys/net.hpp"

namespace ddprun::store {
namespace {

namespace asio = boost::asio;
using detail::AsyncChannel;
using detail::cancelled;
using detail::Clock;
using detail::deadline_after;
using detail::Kind;
using detail::kUseTuple;
using namespace client_frames;  // NOLINT: the frame builders

// One request and its reply as one operation. The coroutine frame holds the channel, so it
// outlives a client destroyed meanwhile; `reply` reads the reply (a member or a callable).
template <typename Reply>
std::invoke_result_t<Reply, AsyncChannel&> request(std::shared_ptr<AsyncChannel> channel,
                                                   std::string frame, Reply reply) {
  const char* name = decode_opcode(Dialect::kTorch2, static_cast<uint8_t>(frame[0]))->name;
  AsyncChannel::Operation guard(*channel, name, channel->call_deadline());
  co_await channel->write(std::move(frame));
  co_return co_await std::invoke(reply, *channel);
}

}  // namespace

AsyncClient::~AsyncClient() {
  channel_->close();
}

asio::awaitable<std::unique_ptr<AsyncClient>> AsyncClient::connect(asio::any_io_executor executor,
                                                                   std::string host, uint16_t port,
                                                                   ClientOptions options) {
  std::string peer = sys::endpoint_text(host, port);
  const auto deadline = deadline_after(options.connect_timeout);
  std::minstd_rand jitter(std::random_device{}());
  auto backoff = std::chrono::milliseconds(10);
  asio::steady_timer pause(executor);
  std::string error;
  for (;;) {
    // One attempt gets at most the default call timeout (a server that accepts but never
    // answers the PING must not eat the whole connect budget).
    auto attempt_deadline = std::min(deadline, deadline_after(options.timeout));
    auto channel = std::make_shared<AsyncChannel>(executor, options, peer);
    const bool opened = co_await channel->open(host, port, attempt_deadline, &error);
    if (cancelled(co_await asio::this_coro::cancellation_state)) break;
    if (opened) co_return std::unique_ptr<AsyncClient>(new AsyncClient(std::move(channel)));
    const auto now = Clock::now();
    if (now >= deadline) break;
    const auto sleep = backoff * (75 + static_cast<int>(jitter() % 50)) / 100;  // +-25 %
    pause.expires_after(std::min<Clock::duration>(sleep, deadline - now));
    co_await pause.async_wait(kUseTuple);
    if (cancelled(co_await asio::this_coro::cancellation_state)) break;
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  if (cancelled(co_await asio::this_coro::cancellation_state)) {
    throw StoreError(Kind::kClosed, "connecting to the store at " + peer + " was cancelled");
  }
  throw StoreError(Kind::kConnect, "cannot connect to the store at " + peer + " within " +
                                       std::to_string(options.connect_timeout.count()) +
                                       " ms: " + error);
}

asio::ip::tcp::socket AsyncClient::release_socket() {
  return channel_->release_socket();
}

asio::awaitable<void> AsyncClient::set(std::string key, std::string value) {
  return request(channel_, key_value_frame(Op::kSet, key, value), &AsyncChannel::no_reply);
}

asio::awaitable<std::string> AsyncClient::get(std::string key) {
  return request(channel_, frame(Op::kGet, key), &AsyncChannel::read_bytes);
}

asio::awaitable<int64_t> AsyncClient::add(std::string key, int64_t delta) {
  return request(channel_, key_i64_frame(Op::kAdd, key, delta), &AsyncChannel::read_le<int64_t>);
}

asio::awaitable<std::string> AsyncClient::compare_set(std::string key, std::string expected,
                                                      std::string desired) {
  return request(channel_, compare_set_frame(Op::kCompareSet, key, expected, desired),
                 &AsyncChannel::read_bytes);
}

asio::awaitable<bool> AsyncClient::check(std::vector<std::string> keys) {
  return request(channel_, frame_keys(Op::kCheck, keys), &AsyncChannel::read_check);
}

asio::awaitable<bool> AsyncClient::wait(std::vector<std::string> keys,
                                        std::chrono::milliseconds timeout) {
  return request(channel_, frame_keys(Op::kWait, keys),
                 [timeout](AsyncChannel& c) { return c.read_release(timeout); });
}

asio::awaitable<std::vector<std::string>> AsyncClient::multi_get(std::vector<std::string> keys) {
  return request(channel_, frame_keys(Op::kMultiGet, keys),
                 [count = keys.size()](AsyncChannel& c) { return c.read_values(count); });
}

asio::awaitable<void> AsyncClient::multi_set(std::vector<std::pair<std::string, std::string>> kvs) {
  return request(channel_, multi_set_frame(kvs), &AsyncChannel::no_reply);
}

asio::awaitable<void> AsyncClient::set_will(std::string key, std::string expected,
                                            std::string desired) {
  return request(channel_, compare_set_frame(Op::kSetWill, key, expected, desired),
                 [](AsyncChannel& c) { return c.read_ack({}, 0); });
}

asio::awaitable<void> AsyncClient::keep_alive(std::chrono::milliseconds interval, int probes) {
  if (interval.count() <= 0 || probes < 1) {
    throw std::invalid_argument("keep_alive: interval and probes must be positive");
  }
  return request(channel_, keep_alive_frame(interval, probes),
                 [interval, probes](AsyncChannel& c) { return c.read_ack(interval, probes); });
}

void AsyncClient::close() {
  channel_->close();
}

const std::string& AsyncClient::peer() const {
  return channel_->peer();
}

}  // namespace ddprun::store
