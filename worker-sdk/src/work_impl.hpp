// What a ddprun::Work handle points at: a c10d collective, or an operation of the SDK's own
// shared-memory transport. Internal.
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>

#include "ddprun/process_group.hpp"

namespace ddprun {

struct Work::Impl {
  virtual ~Impl() = default;
  virtual void wait() = 0;
  virtual bool completed() = 0;
};

// Completed from another thread (the transport's worker): done() or fail() exactly once.
class PromiseWork : public Work::Impl {
 public:
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  void done() { finish(nullptr); }
  void fail(std::exception_ptr e) { finish(std::move(e)); }

 private:
  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::move(e);
      done_ = true;
    }
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace ddprun
