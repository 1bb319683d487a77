#include "store/store_state.hpp"

#include <cctype>
#include <charconv>

namespace ddprun::store {

std::optional<int64_t> parse_counter(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i < text.size() && text[i] == '+') ++i;
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data() + i, text.data() + text.size(), value);
  if (ec != std::errc()) return std::nullopt;
  return value;
}

void StoreState::set(std::string key, std::string value) {
  auto [it, inserted] = map_.try_emplace(std::move(key), std::move(value));
  if (!inserted) it->second = std::move(value);
  waiters_.notify_all(it->first);
}

std::string StoreState::compare_set(std::string key, const std::string& expected,
                                    std::string desired) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    if (!expected.empty()) return expected;
    it = map_.emplace(std::move(key), desired).first;
  } else if (it->second == expected) {
    it->second = desired;
  } else {
    return it->second;
  }
  waiters_.notify_all(it->first);
  return desired;
}

const std::string* StoreState::find(const std::string& key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

std::optional<int64_t> StoreState::add(const std::string& key, int64_t delta) {
  auto it = map_.find(key);
  int64_t sum = delta;
  if (it != map_.end()) {
    std::optional<int64_t> current = parse_counter(it->second);
    if (!current || __builtin_add_overflow(*current, delta, &sum)) return std::nullopt;
    it->second = std::to_string(sum);
  } else {
    it = map_.emplace(key, std::to_string(sum)).first;
  }
  waiters_.notify_all(it->first);
  return sum;
}

bool StoreState::present(const std::string& key) const {
  if (map_.count(key) > 0) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

bool StoreState::check(const std::vector<std::string>& keys) const {
  for (const std::string& key : keys) {
    if (!present(key)) return false;
  }
  return true;
}

bool StoreState::wait(const std::vector<std::string>& keys, Waiter& waiter) {
  std::vector<const std::string*> missing;
  for (const std::string& key : keys) {
    if (!present(key)) missing.push_back(&key);
  }
  if (missing.empty()) return true;
  waiters_.park(waiter, missing);
  return false;
}

void StoreState::append(std::string key, std::string_view data) {
  auto [it, inserted] = map_.try_emplace(std::move(key));
  it->second.append(data);
  waiters_.notify_all(it->first);
}

void StoreState::queue_push(std::string key, std::string value) {
  auto [it, inserted] = queues_.try_emplace(std::move(key));
  it->second.push_back(std::move(value));
  waiters_.notify_one(it->first);
}

std::pair<int64_t, std::string> StoreState::queue_pop(const std::string& key) {
  auto it = queues_.find(key);
  if (it == queues_.end()) return {0, {}};
  auto length = static_cast<int64_t>(it->second.size());
  std::string value = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return {length, std::move(value)};
}

size_t StoreState::queue_front_size(const std::string& key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : it->second.front().size();
}

int64_t StoreState::queue_len(const std::string& key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

StoreState::BarrierResult StoreState::barrier(const std::string& key, int64_t world_size,
                                              Waiter& waiter) {
  auto it = map_.find(key);
  int64_t count = 1;
  if (it != map_.end()) {
    std::optional<int64_t> current = parse_counter(it->second);
    if (!current || __builtin_add_overflow(*current, 1, &count)) {
      return BarrierResult::kBadCounter;
    }
    it->second = std::to_string(count);
  } else {
    // Creating the counter releases WAITs on the key; barrier waiters only park once it
    // exists, so they are not woken by this.
    it = map_.emplace(key, "1").first;
    waiters_.notify_all(it->first);
  }
  if (count >= world_size) {
    waiters_.notify_all(it->first);
    return BarrierResult::kReleased;
  }
  waiters_.park(waiter, {&it->first});
  return BarrierResult::kWaiting;
}

}  // namespace ddprun::store
