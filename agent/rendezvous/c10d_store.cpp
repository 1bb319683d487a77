#include "agent/rendezvous/c10d_store.hpp"

namespace ddprun::agent {

RendezvousStore::awaitable<int64_t> C10dStore::add(std::string key, int64_t delta) {
  co_return co_await client_->add(std::move(key), delta);
}

RendezvousStore::awaitable<std::string> C10dStore::compare_set(std::string key,
                                                               std::string expected,
                                                               std::string desired) {
  co_return co_await client_->compare_set(std::move(key), std::move(expected), std::move(desired));
}

RendezvousStore::awaitable<bool> C10dStore::check(std::vector<std::string> keys) {
  co_return co_await client_->check(std::move(keys));
}

RendezvousStore::awaitable<bool> C10dStore::wait(std::vector<std::string> keys, Millis timeout) {
  co_return co_await client_->wait(std::move(keys), timeout);
}

RendezvousStore::awaitable<std::vector<std::string>> C10dStore::multi_get(
    std::vector<std::string> keys) {
  co_return co_await client_->multi_get(std::move(keys));
}

RendezvousStore::awaitable<void> C10dStore::multi_set(
    std::vector<std::pair<std::string, std::string>> kvs) {
  co_await client_->multi_set(std::move(kvs));
}

RendezvousStore::awaitable<void> C10dStore::set_will(std::string key, std::string expected,
                                                     std::string desired) {
  co_await client_->set_will(std::move(key), std::move(expected), std::move(desired));
}

}  // namespace ddprun::agent
