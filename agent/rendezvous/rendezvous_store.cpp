#include "agent/rendezvous/rendezvous_store.hpp"

#include "store/client.hpp"
#include "store/sys/time_text.hpp"

namespace ddprun::agent {

// Arguments are built as named locals before each co_await: GCC 12 miscompiles temporaries
// with non-trivial destructors inside co_await expressions.

RendezvousStore::awaitable<void> RendezvousStore::set(std::string key, std::string value) {
  std::vector<std::pair<std::string, std::string>> kvs;
  kvs.emplace_back(std::move(key), std::move(value));
  co_await multi_set(std::move(kvs));
}

RendezvousStore::awaitable<std::string> RendezvousStore::get(std::string key, Millis timeout) {
  std::vector<std::string> wanted{key};
  bool present = co_await wait(std::move(wanted), timeout);
  if (!present) {
    throw store::StoreError(
        store::StoreError::Kind::kTimeout,
        "timed out after " + sys::seconds_text(timeout) + " waiting for '" + key + "'");
  }
  std::vector<std::string> read{key};
  std::vector<std::string> values = co_await multi_get(std::move(read));
  co_return std::move(values.at(0));
}

}  // namespace ddprun::agent
