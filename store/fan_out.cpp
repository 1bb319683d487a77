#include "store/fan_out.hpp"

#include <algorithm>
#include <system_error>

namespace ddprun::store::detail {
namespace {

constexpr size_t kChunk = 16;  // items claimed at a time: fewer atomic operations

}  // namespace

FanOut::FanOut(size_t helpers) : helpers_(helpers) {}

FanOut::~FanOut() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

size_t FanOut::default_helpers() {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores > 1 ? std::min<size_t>(cores - 1, 7) : 0;
}

void FanOut::run(size_t n, const std::function<void(size_t)>& item) {
  if (helpers_ == 0 || n <= kChunk) {
    for (size_t i = 0; i < n; ++i) item(i);
    return;
  }
  bool alone = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (threads_.empty()) {
      try {
        for (size_t i = 0; i < helpers_; ++i) threads_.emplace_back([this] { helper_main(); });
      } catch (const std::system_error&) {  // no threads to be had (RLIMIT_NPROC): fewer helpers
      }
    }
    alone = threads_.empty();
    if (!alone) {
      item_ = &item;
      count_ = n;
      next_.store(0, std::memory_order_relaxed);
      busy_ = threads_.size();
      ++job_;
    }
  }
  if (alone) {
    for (size_t i = 0; i < n; ++i) item(i);
    return;
  }
  start_cv_.notify_all();
  work();
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [this] { return busy_ == 0; });
  item_ = nullptr;
}

// Claims chunks of the current job until none is left.
void FanOut::work() {
  for (;;) {
    const size_t begin = next_.fetch_add(kChunk, std::memory_order_relaxed);
    if (begin >= count_) return;
    const size_t end = std::min(begin + kChunk, count_);
    for (size_t i = begin; i < end; ++i) (*item_)(i);
  }
}

void FanOut::helper_main() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, [&] { return stopping_ || job_ != seen; });
      if (stopping_) return;
      seen = job_;
    }
    work();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_;
    }
    done_cv_.notify_one();
  }
}

}  // namespace ddprun::store::detail
