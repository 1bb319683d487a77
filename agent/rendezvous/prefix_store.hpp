// PrefixStore: a RendezvousStore whose keys all live under one prefix (gloo's PrefixStore),
// so jobs with different --rdzv-id share a store without seeing each other's keys. Every key
// gets the prefix, the last will's included (an empty will key stays empty: it clears).
//
// Owns the wrapped client; used like it (the same executor, one operation at a time), and
// close() forwards to it.
#pragma once

#include <memory>
#include <string>

#include "agent/rendezvous/rendezvous_store.hpp"

namespace ddprun::agent {

class PrefixStore final : public RendezvousStore {
 public:
  PrefixStore(std::unique_ptr<RendezvousStore> inner, std::string prefix)
      : inner_(std::move(inner)), prefix_(std::move(prefix)) {}

  awaitable<int64_t> add(std::string key, int64_t delta) override;
  awaitable<std::string> compare_set(std::string key, std::string expected,
                                     std::string desired) override;
  awaitable<bool> check(std::vector<std::string> keys) override;
  awaitable<bool> wait(std::vector<std::string> keys, Millis timeout) override;
  awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys) override;
  awaitable<void> multi_set(std::vector<std::pair<std::string, std::string>> kvs) override;
  awaitable<void> set_will(std::string key, std::string expected, std::string desired) override;
  void close() override { inner_->close(); }

  // The wrapped client (for MemoryStore::kill in tests).
  RendezvousStore& inner() { return *inner_; }
  const std::string& prefix() const { return prefix_; }

 private:
  void add_prefix(std::string& key) const { key.insert(0, prefix_); }
  void add_prefix(std::vector<std::string>& keys) const;

  std::unique_ptr<RendezvousStore> inner_;
  std::string prefix_;
};

}  // namespace ddprun::agent
