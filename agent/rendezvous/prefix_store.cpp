#include "agent/rendezvous/prefix_store.hpp"

namespace ddprun::agent {

// Keys are prefixed in place and passed on as named locals, and results land in named locals:
// GCC 12 miscompiles temporaries with non-trivial destructors inside co_await expressions.

void PrefixStore::add_prefix(std::vector<std::string>& keys) const {
  for (std::string& key : keys) add_prefix(key);
}

RendezvousStore::awaitable<int64_t> PrefixStore::add(std::string key, int64_t delta) {
  add_prefix(key);
  co_return co_await inner_->add(std::move(key), delta);
}

RendezvousStore::awaitable<std::string> PrefixStore::compare_set(std::string key,
                                                                 std::string expected,
                                                                 std::string desired) {
  add_prefix(key);
  std::string stored =
      co_await inner_->compare_set(std::move(key), std::move(expected), std::move(desired));
  co_return stored;
}

RendezvousStore::awaitable<bool> PrefixStore::check(std::vector<std::string> keys) {
  add_prefix(keys);
  co_return co_await inner_->check(std::move(keys));
}

RendezvousStore::awaitable<bool> PrefixStore::wait(std::vector<std::string> keys, Millis timeout) {
  add_prefix(keys);
  co_return co_await inner_->wait(std::move(keys), timeout);
}

RendezvousStore::awaitable<std::vector<std::string>> PrefixStore::multi_get(
    std::vector<std::string> keys) {
  add_prefix(keys);
  std::vector<std::string> values = co_await inner_->multi_get(std::move(keys));
  co_return values;
}

RendezvousStore::awaitable<void> PrefixStore::multi_set(
    std::vector<std::pair<std::string, std::string>> kvs) {
  for (auto& kv : kvs) add_prefix(kv.first);
  co_await inner_->multi_set(std::move(kvs));
}

RendezvousStore::awaitable<void> PrefixStore::set_will(std::string key, std::string expected,
                                                       std::string desired) {
  if (!key.empty()) add_prefix(key);  // an empty key clears the will, prefixed or not
  co_await inner_->set_will(std::move(key), std::move(expected), std::move(desired));
}

}  // namespace ddprun::agent
