#include "agent/rendezvous/memory_store.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "store/client.hpp"
#include "store/store_state.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;
using store::StoreError;
using Clock = std::chrono::steady_clock;

struct Will {
  std::string key;
  std::string expected;
  std::string desired;
};

// One wait() parked in the store. Shared between the waiting coroutine and the cancel posted
// to its executor, because the timer may have fired on its own before that post runs.
class ParkedWait final : public store::Waiter, public std::enable_shared_from_this<ParkedWait> {
 public:
  explicit ParkedWait(const asio::any_io_executor& executor) : timer_(executor) {}

  // Both under the store's mutex, from any thread. The timer itself is only touched on its
  // executor, which runs the waiting coroutine: a cancel posted before the coroutine reached
  // async_wait cannot run before it does.
  bool woken() const { return woken_; }
  void interrupt() {
    asio::post(timer_.get_executor(), [self = shared_from_this()] { self->timer_.cancel(); });
  }

  // On the waiter's executor, without the mutex: returns when the timer fires or is cancelled.
  asio::awaitable<void> sleep_until(Clock::time_point deadline) {
    timer_.expires_at(deadline);
    boost::system::error_code ec;
    co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }

 private:
  // From StoreState, under the mutex, on the writer's thread.
  void on_wake() override {
    woken_ = true;
    interrupt();
  }

  asio::steady_timer timer_;
  bool woken_ = false;
};

// One client's side of the store, shared by the client and its suspended wait() (which may
// outlive the client).
struct Connection {
  asio::any_io_executor executor;
  // The rest under the store's mutex.
  bool closed = false;
  std::optional<Will> will;
  std::shared_ptr<ParkedWait> parked;
};

Clock::time_point deadline_after(RendezvousStore::Millis timeout) {
  Clock::time_point now = Clock::now();
  // Non-positive: no deadline; a huge one would overflow the clock.
  if (timeout <= RendezvousStore::Millis::zero() ||
      timeout >=
          std::chrono::duration_cast<RendezvousStore::Millis>(Clock::time_point::max() - now)) {
    return Clock::time_point::max();
  }
  return now + timeout;
}

}  // namespace

struct detail::MemoryStoreState {
  std::mutex mutex;
  // The rest under the mutex.
  store::StoreState data;
  std::unordered_map<const RendezvousStore*, std::shared_ptr<Connection>> live;

  // Ends `conn` once: its parked wait ends (with kClosed, even if its own will wakes it),
  // then its will applies like any other COMPARE_SET. False if it had already ended.
  bool end(Connection& conn) {
    if (conn.closed) return false;
    conn.closed = true;
    if (conn.parked) conn.parked->interrupt();
    if (std::optional<Will> will = std::exchange(conn.will, std::nullopt)) {
      data.compare_set(std::move(will->key), will->expected, std::move(will->desired));
    }
    return true;
  }
};

namespace {

using State = detail::MemoryStoreState;

void throw_if_closed(const Connection& conn) {
  if (conn.closed) throw StoreError(StoreError::Kind::kClosed, "memory store client closed");
}

class MemoryClient final : public RendezvousStore {
 public:
  MemoryClient(std::shared_ptr<State> state, asio::any_io_executor executor)
      : state_(std::move(state)), conn_(std::make_shared<Connection>()) {
    conn_->executor = std::move(executor);
    std::lock_guard lock(state_->mutex);
    state_->live.emplace(this, conn_);
  }
  ~MemoryClient() override { close(); }

  awaitable<int64_t> add(std::string key, int64_t delta) override {
    std::lock_guard lock(state_->mutex);
    throw_if_closed(*conn_);
    std::optional<int64_t> sum = state_->data.add(key, delta);
    if (!sum) {
      throw StoreError(StoreError::Kind::kProtocol,
                       "add to '" + key + "': the value is not a number or the sum overflows");
    }
    co_return *sum;
  }

  awaitable<std::string> compare_set(std::string key, std::string expected,
                                     std::string desired) override {
    std::lock_guard lock(state_->mutex);
    throw_if_closed(*conn_);
    co_return state_->data.compare_set(std::move(key), expected, std::move(desired));
  }

  awaitable<bool> check(std::vector<std::string> keys) override {
    std::lock_guard lock(state_->mutex);
    throw_if_closed(*conn_);
    co_return state_->data.check(keys);
  }

  awaitable<bool> wait(std::vector<std::string> keys, Millis timeout) override;

  awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys) override {
    std::lock_guard lock(state_->mutex);
    throw_if_closed(*conn_);
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (const std::string& key : keys) {
      const std::string* value = state_->data.find(key);
      values.push_back(value != nullptr ? *value : std::string());
    }
    co_return values;
  }

  awaitable<void> multi_set(std::vector<std::pair<std::string, std::string>> kvs) override {
    std::lock_guard lock(state_->mutex);
    throw_if_closed(*conn_);
    for (auto& [key, value] : kvs) state_->data.set(std::move(key), std::move(value));
    co_return;
  }

  awaitable<void> set_will(std::string key, std::string expected, std::string desired) override {
    std::lock_guard lock(state_->mutex);
    throw_if_closed(*conn_);
    if (key.empty()) {
      conn_->will.reset();
    } else {
      conn_->will = Will{std::move(key), std::move(expected), std::move(desired)};
    }
    co_return;
  }

  void close() override {
    std::lock_guard lock(state_->mutex);
    if (state_->end(*conn_)) state_->live.erase(this);
  }

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<Connection> conn_;
};

RendezvousStore::awaitable<bool> MemoryClient::wait(std::vector<std::string> keys, Millis timeout) {
  // Copies, and no member used below: the client may be destroyed while this is suspended.
  std::shared_ptr<State> state = state_;
  std::shared_ptr<Connection> conn = conn_;
  Clock::time_point deadline = deadline_after(timeout);
  auto parked = std::make_shared<ParkedWait>(conn->executor);
  // Unparks however this frame ends (returned, thrown, or destroyed with its io_context), so
  // the store never holds a waiter that is gone.
  struct Unpark {
    State& state;
    Connection& conn;
    ParkedWait& parked;
    ~Unpark() {
      std::lock_guard lock(state.mutex);
      state.data.cancel_wait(parked);
      if (conn.parked.get() == &parked) conn.parked.reset();
    }
  };
  {
    std::lock_guard lock(state->mutex);
    throw_if_closed(*conn);
    if (state->data.wait(keys, *parked)) co_return true;
    conn->parked = parked;
  }
  Unpark unpark{*state, *conn, *parked};
  for (;;) {
    co_await parked->sleep_until(deadline);
    std::lock_guard lock(state->mutex);
    throw_if_closed(*conn);
    if (parked->woken()) co_return true;
    if (Clock::now() >= deadline) co_return false;
  }
}

}  // namespace

MemoryStore::MemoryStore() : state_(std::make_shared<State>()) {}

MemoryStore::~MemoryStore() = default;

std::unique_ptr<RendezvousStore> MemoryStore::connect(asio::any_io_executor executor) {
  return std::make_unique<MemoryClient>(state_, std::move(executor));
}

bool MemoryStore::kill(const RendezvousStore& client) {
  std::lock_guard lock(state_->mutex);
  auto it = state_->live.find(&client);
  if (it == state_->live.end()) return false;
  std::shared_ptr<Connection> conn = std::move(it->second);
  state_->live.erase(it);
  return state_->end(*conn);
}

}  // namespace ddprun::agent
