#include "store/testing/store_model.hpp"

#include <algorithm>
#include <stdexcept>

#include "store/store_state.hpp"

namespace ddprun::store::testing {
namespace {

void encode_bytes(std::string& out, const std::string& bytes) {
  out += std::to_string(bytes.size());
  out += ':';
  out += bytes;
}

uint64_t bit(int key) {
  return uint64_t{1} << key;
}

}  // namespace

StoreModel::StoreModel(size_t key_count) : values_(key_count), queues_(key_count) {
  if (key_count > kMaxKeys) throw std::invalid_argument("StoreModel: more than 64 keys");
}

void StoreModel::set(int key, std::string value) {
  values_[key] = std::move(value);
  notify_all(key);
}

void StoreModel::append(int key, const std::string& data) {
  if (values_[key]) {
    *values_[key] += data;
  } else {
    values_[key] = data;
  }
  notify_all(key);
}

const std::string* StoreModel::find(int key) const {
  return values_[key] ? &*values_[key] : nullptr;
}

std::optional<int64_t> StoreModel::add(int key, int64_t delta) {
  int64_t sum = delta;
  if (values_[key]) {
    std::optional<int64_t> current = parse_counter(*values_[key]);
    if (!current || __builtin_add_overflow(*current, delta, &sum)) return std::nullopt;
  }
  values_[key] = std::to_string(sum);
  notify_all(key);
  return sum;
}

std::string StoreModel::compare_set(int key, const std::string& expected,
                                    const std::string& desired) {
  if (!values_[key]) {
    if (!expected.empty()) return expected;
  } else if (*values_[key] != expected) {
    return *values_[key];
  }
  values_[key] = desired;
  notify_all(key);
  return desired;
}

bool StoreModel::erase(int key) {
  bool erased = values_[key].has_value();
  values_[key].reset();
  return erased;
}

bool StoreModel::present(int key) const {
  return values_[key] || !queues_[key].empty();
}

bool StoreModel::check(const std::vector<int>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [this](int key) { return present(key); });
}

int64_t StoreModel::num_keys() const {
  return std::count_if(values_.begin(), values_.end(), [](const auto& v) { return v.has_value(); });
}

void StoreModel::queue_push(int key, std::string value) {
  queues_[key].push_back(std::move(value));
  notify_one(key);
}

std::optional<std::string> StoreModel::queue_pop(int key) {
  std::vector<std::string>& queue = queues_[key];
  if (queue.empty()) return std::nullopt;
  std::string value = std::move(queue.front());
  queue.erase(queue.begin());
  return value;
}

int64_t StoreModel::queue_len(int key) const {
  return static_cast<int64_t>(queues_[key].size());
}

void StoreModel::wait_start(int waiter, const std::vector<int>& keys) {
  uint64_t missing = 0;
  for (int key : keys) {
    if (!present(key)) missing |= bit(key);
  }
  parked_.push_back({waiter, missing});
}

const StoreModel::Parked* StoreModel::parked(int waiter) const {
  for (const Parked& p : parked_) {
    if (p.waiter == waiter) return &p;
  }
  return nullptr;
}

bool StoreModel::wait_released(int waiter) const {
  const Parked* p = parked(waiter);
  return p != nullptr && p->missing == 0;
}

void StoreModel::wait_end(int waiter) {
  std::erase_if(parked_, [waiter](const Parked& p) { return p.waiter == waiter; });
}

void StoreModel::notify_all(int key) {
  for (Parked& p : parked_) p.missing &= ~bit(key);
}

void StoreModel::notify_one(int key) {
  for (Parked& p : parked_) {
    if ((p.missing & bit(key)) == 0) continue;
    p.missing &= ~bit(key);
    if (p.missing == 0) return;
  }
}

void StoreModel::encode(std::string& out) const {
  for (const auto& value : values_) {
    if (value) {
      encode_bytes(out, *value);
    } else {
      out += '-';
    }
  }
  out += '|';
  for (const auto& queue : queues_) {
    for (const std::string& item : queue) encode_bytes(out, item);
    out += ';';
  }
  out += '|';
  for (const Parked& p : parked_) {
    out += std::to_string(p.waiter) + ':' + std::to_string(p.missing) + ';';
  }
}

std::string StoreModel::describe(const std::vector<std::string>& key_names) const {
  std::string out = "{";
  auto sep = [&out] {
    if (out.size() > 1) out += ", ";
  };
  for (size_t k = 0; k < values_.size(); ++k) {
    sep();
    out += '"' + key_names[k] + '"' + (values_[k] ? "=\"" + *values_[k] + '"' : " absent");
  }
  for (size_t k = 0; k < queues_.size(); ++k) {
    if (queues_[k].empty()) continue;
    sep();
    out += "queue \"" + key_names[k] + "\"=[";
    for (size_t i = 0; i < queues_[k].size(); ++i) {
      out += (i ? ", \"" : "\"") + queues_[k][i] + '"';
    }
    out += ']';
  }
  for (const Parked& p : parked_) {
    sep();
    out += "c" + std::to_string(p.waiter) + "'s WAIT ";
    if (p.missing == 0) {
      out += "released";
      continue;
    }
    out += "needs a write to";
    for (size_t k = 0; k < key_names.size(); ++k) {
      if (p.missing & bit(static_cast<int>(k))) out += " \"" + key_names[k] + '"';
    }
  }
  return out + "}";
}

}  // namespace ddprun::store::testing
