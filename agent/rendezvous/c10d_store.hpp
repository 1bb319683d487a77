// C10dStore: the rendezvous store interface over ddprun's TCPStore, through
// store::AsyncClient on the agent's io_context (no helper thread). The last will is the
// ddprun-only SET_WILL op and liveness is TCP keep-alive on both ends (KEEP_ALIVE), so it
// needs a ddprun store (an agent's or a ddpstore); torch's servers close the connection at
// the first ddprun-only op, which the caller reports.
//
// Threads: as store::AsyncClient (the executor it was connected on, one operation at a time).
#pragma once

#include <memory>

#include "agent/rendezvous/rendezvous_store.hpp"
#include "store/async_client.hpp"

namespace ddprun::agent {

class C10dStore final : public RendezvousStore {
 public:
  explicit C10dStore(std::unique_ptr<store::AsyncClient> client) : client_(std::move(client)) {}

  awaitable<int64_t> add(std::string key, int64_t delta) override;
  awaitable<std::string> compare_set(std::string key, std::string expected,
                                     std::string desired) override;
  awaitable<bool> check(std::vector<std::string> keys) override;
  awaitable<bool> wait(std::vector<std::string> keys, Millis timeout) override;
  awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys) override;
  awaitable<void> multi_set(std::vector<std::pair<std::string, std::string>> kvs) override;
  awaitable<void> set_will(std::string key, std::string expected, std::string desired) override;
  void close() override { client_->close(); }

 private:
  std::unique_ptr<store::AsyncClient> client_;
};

}  // namespace ddprun::agent
