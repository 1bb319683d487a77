// Test helper: runs N ranks as N threads of one process, each with its own Gloo group over a
// shared in-memory store (as Gloo's own tests do). The first failure is rethrown.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "ddprun/process_group.hpp"

namespace ddprun::testing {

inline void run_ranks(int world, const std::function<void(int rank, ProcessGroup& pg)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        InitOptions options;
        options.backend = Backend::kGloo;
        options.timeout = std::chrono::seconds(60);
        auto pg = new_process_group(store, r, world, options);
        body(r, *pg);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// Like run_ranks, but each rank's exception message is collected instead of rethrown.
inline std::vector<std::string> errors_of_ranks(
    int world, const std::function<void(int rank, ProcessGroup& pg)>& body) {
  std::vector<std::string> errors(world);
  run_ranks(world, [&](int rank, ProcessGroup& pg) {
    try {
      body(rank, pg);
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  });
  return errors;
}

}  // namespace ddprun::testing
