// Connections parked in WAIT or BARRIER, indexed by key.
//
// A Waiter (one per connection) is parked on a set of keys and wakes once every one of them
// has been notified. Each parked key is one intrusive list node owned by the Waiter, so
// notifying a key, cancelling a wait and closing a connection cost O(keys involved), not
// O(all waiters). Single-threaded: the server's io_context thread owns all of it.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

namespace ddprun::store {

class WaitRegistry;

class Waiter {
 public:
  Waiter() = default;
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;
  // Unparks itself (RAII): a closed connection never gets woken.
  virtual ~Waiter();

  bool parked() const { return keys_left_ > 0; }

 protected:
  // Every parked key has been notified. Called from inside WaitRegistry::notify_*; must not
  // destroy this Waiter or touch the registry.
  virtual void on_wake() = 0;

 private:
  friend class WaitRegistry;
  struct List;
  struct Node {
    Waiter* owner = nullptr;
    Node* prev = nullptr;
    Node* next = nullptr;
    std::pair<const std::string, List>* entry = nullptr;  // null once unlinked
  };
  struct List {
    Node* head = nullptr;
    Node* tail = nullptr;
  };
  std::vector<Node> nodes_;
  size_t keys_left_ = 0;
  WaitRegistry* registry_ = nullptr;
};

class WaitRegistry {
 public:
  WaitRegistry() = default;
  WaitRegistry(const WaitRegistry&) = delete;
  WaitRegistry& operator=(const WaitRegistry&) = delete;
  ~WaitRegistry();

  // Parks `waiter` (not already parked) until every key of `keys` is notified. `keys` must
  // not be empty.
  void park(Waiter& waiter, const std::vector<const std::string*>& keys);
  // The key was created or changed: every waiter parked on it counts it; those with no key
  // left wake, in the order they parked.
  void notify_all(const std::string& key);
  // A queue item arrived: waiters count it in the order they parked, until one wakes.
  void notify_one(const std::string& key);
  // Unparks without waking (CANCEL_WAIT, a 1.13 client moving on, a closed connection).
  void cancel(Waiter& waiter);

  // Keys with at least one parked waiter (for tests and stats).
  size_t parked_key_count() const { return lists_.size(); }

 private:
  void unlink(Waiter::Node& node);
  void count_and_maybe_wake(Waiter& waiter);

  std::unordered_map<std::string, Waiter::List> lists_;
};

}  // namespace ddprun::store
