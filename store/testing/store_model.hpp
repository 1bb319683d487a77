// The store's sequential semantics (PROTOCOL.md, "Semantics") as a small value type, for the
// linearizability checker: it copies one per search branch and remembers the states it has
// seen, which StoreState (intrusive waiter lists, hash maps) does not allow. The rules are
// StoreState's, ADD's parsing is its parse_counter(), and store_linearizability_test runs both
// side by side on random operations to keep them equal.
//
// Keys are small integers (the checker interns a history's key names); a queue is named by
// the same integers and lives beside the key map, as in the store. Waiters are named by an
// int (the checker uses the client id): at most one parked WAIT per waiter.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::store::testing {

class StoreModel {
 public:
  static constexpr size_t kMaxKeys = 64;  // a parked WAIT's missing keys are a bit mask

  explicit StoreModel(size_t key_count);

  // SET, APPEND (create or concatenate): wake every waiter on the key.
  void set(int key, std::string value);
  void append(int key, const std::string& data);
  // The value, or null if the key is absent (GET then replies empty).
  const std::string* find(int key) const;
  // ADD: nullopt where the store would close the connection (not a number, overflow).
  std::optional<int64_t> add(int key, int64_t delta);
  // COMPARE_SET's four cases; returns the reply and wakes waiters if it stored `desired`.
  std::string compare_set(int key, const std::string& expected, const std::string& desired);
  // DELETE_KEY: wakes nobody, leaves queues alone.
  bool erase(int key);
  // CHECK: each key is in the map or names a non-empty queue.
  bool check(const std::vector<int>& keys) const;
  int64_t num_keys() const;  // the key map only

  // QUEUE_PUSH wakes one waiter: parked waiters count it in park order until one wakes.
  void queue_push(int key, std::string value);
  std::optional<std::string> queue_pop(int key);  // nullopt: the queue was empty
  int64_t queue_len(int key) const;

  // WAIT in two halves. wait_start() is the moment the store looks at the keys: `waiter` is
  // parked on those missing then. wait_released() is true once each of them has been written
  // since (at once if none was missing); wait_end() forgets the waiter (after its release).
  void wait_start(int waiter, const std::vector<int>& keys);
  bool wait_released(int waiter) const;
  void wait_end(int waiter);

  // Appends a canonical encoding: equal states give equal bytes.
  void encode(std::string& out) const;
  // For explanations: `{"a"="3", "b" absent, queue "q"=["x"], c1 waits for "b"}`.
  std::string describe(const std::vector<std::string>& key_names) const;

 private:
  struct Parked {
    int waiter;
    uint64_t missing;  // bit per key not yet written since the WAIT started
  };
  bool present(int key) const;
  void notify_all(int key);
  void notify_one(int key);
  const Parked* parked(int waiter) const;

  std::vector<std::optional<std::string>> values_;
  std::vector<std::vector<std::string>> queues_;
  std::vector<Parked> parked_;  // in the order they parked
};

}  // namespace ddprun::store::testing
