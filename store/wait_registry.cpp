#include "store/wait_registry.hpp"

namespace ddprun::store {

Waiter::~Waiter() {
  if (parked() && registry_ != nullptr) registry_->cancel(*this);
}

WaitRegistry::~WaitRegistry() {
  // Waiters may outlive the registry only in teardown; make their destructors no-ops.
  for (auto& [key, list] : lists_) {
    for (Waiter::Node* n = list.head; n != nullptr; n = n->next) {
      n->owner->keys_left_ = 0;
      n->owner->registry_ = nullptr;
    }
  }
}

void WaitRegistry::park(Waiter& waiter, const std::vector<const std::string*>& keys) {
  waiter.nodes_.assign(keys.size(), Waiter::Node{});
  waiter.keys_left_ = keys.size();
  waiter.registry_ = this;
  for (size_t i = 0; i < keys.size(); ++i) {
    Waiter::Node& node = waiter.nodes_[i];
    auto& entry = *lists_.try_emplace(*keys[i]).first;
    Waiter::List& list = entry.second;
    node.owner = &waiter;
    node.entry = &entry;
    node.prev = list.tail;
    if (list.tail != nullptr) {
      list.tail->next = &node;
    } else {
      list.head = &node;
    }
    list.tail = &node;
  }
}

void WaitRegistry::notify_all(const std::string& key) {
  auto it = lists_.find(key);
  if (it == lists_.end()) return;
  Waiter::List list = it->second;
  lists_.erase(it);
  for (Waiter::Node* n = list.head; n != nullptr;) {
    Waiter::Node* next = n->next;
    n->entry = nullptr;
    n->prev = n->next = nullptr;
    count_and_maybe_wake(*n->owner);  // may free n (the waiter's nodes): n is not used again
    n = next;
  }
}

void WaitRegistry::notify_one(const std::string& key) {
  for (;;) {
    auto it = lists_.find(key);
    if (it == lists_.end()) return;
    Waiter::Node* n = it->second.head;
    Waiter& waiter = *n->owner;
    unlink(*n);
    bool woke = waiter.keys_left_ == 1;
    count_and_maybe_wake(waiter);
    if (woke) return;
  }
}

void WaitRegistry::cancel(Waiter& waiter) {
  for (Waiter::Node& node : waiter.nodes_) {
    if (node.entry != nullptr) unlink(node);
  }
  std::vector<Waiter::Node>().swap(waiter.nodes_);
  waiter.keys_left_ = 0;
}

void WaitRegistry::unlink(Waiter::Node& node) {
  Waiter::List& list = node.entry->second;
  if (node.prev != nullptr) {
    node.prev->next = node.next;
  } else {
    list.head = node.next;
  }
  if (node.next != nullptr) {
    node.next->prev = node.prev;
  } else {
    list.tail = node.prev;
  }
  if (list.head == nullptr) lists_.erase(lists_.find(node.entry->first));
  node.entry = nullptr;
  node.prev = node.next = nullptr;
}

void WaitRegistry::count_and_maybe_wake(Waiter& waiter) {
  if (--waiter.keys_left_ > 0) return;
  std::vector<Waiter::Node>().swap(waiter.nodes_);
  waiter.on_wake();
}

}  // namespace ddprun::store
