// PrefixClient: a store::Client whose keys all live under one prefix (gloo's PrefixStore),
// so jobs with different --rdzv-id share a store without seeing each other's keys.
//
// Owns its connection. Not thread-safe, like store::Client: one thread calls at a time,
// except interrupt(), which any thread may call to make a blocked call throw.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "store/client.hpp"

namespace ddprun::agent {

class PrefixClient {
 public:
  PrefixClient(std::unique_ptr<store::Client> client, std::string prefix)
      : client_(std::move(client)), prefix_(std::move(prefix)) {}

  void set(std::string_view key, std::string_view value) { client_->set(k(key), value); }
  std::string get(std::string_view key, std::chrono::milliseconds timeout) {
    return client_->get(k(key), timeout);
  }
  int64_t add(std::string_view key, int64_t delta) { return client_->add(k(key), delta); }
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) {
    return client_->compare_set(k(key), expected, desired);
  }
  bool check(const std::vector<std::string>& keys) { return client_->check(ks(keys)); }
  // Non-positive timeout: no deadline.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    client_->wait(ks(keys), timeout);
  }
  // WAITs (with `timeout`), then MULTI_GETs.
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     std::chrono::milliseconds timeout) {
    auto full = ks(keys);
    client_->wait(full, timeout);
    return client_->multi_get(full);
  }
  void multi_set(const std::vector<std::pair<std::string, std::string>>& kvs) {
    std::vector<std::pair<std::string, std::string>> full;
    full.reserve(kvs.size());
    for (const auto& [key, value] : kvs) full.emplace_back(k(key), value);
    client_->multi_set(full);
  }
  // ddprun's "last will": when this connection closes, the store applies
  // COMPARE_SET(key, expected, desired). An empty key clears the will.
  void set_will(std::string_view key, std::string_view expected, std::string_view desired) {
    client_->set_will(key.empty() ? std::string() : k(key), expected, desired);
  }
  // TCP keep-alive on both ends of this connection: a peer that stops answering for
  // interval x probes is treated as gone (the store fires the will; we see kClosed).
  void keep_alive(std::chrono::milliseconds interval, int probes) {
    client_->keep_alive(interval, probes);
  }
  void interrupt() { client_->interrupt(); }

  const std::string& prefix() const { return prefix_; }

 private:
  std::string k(std::string_view key) const { return prefix_ + std::string(key); }
  std::vector<std::string> ks(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& key : keys) out.push_back(k(key));
    return out;
  }

  std::unique_ptr<store::Client> client_;
  std::string prefix_;
};

}  // namespace ddprun::agent
