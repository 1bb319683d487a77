// Shared by the Session tests: a session fed bytes directly (no socket), and reply encoders.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "store/session.hpp"
#include "store/test_frames.hpp"

namespace ddprun::store::test {

struct Peer : OutputListener {
  Peer(StoreState& state, Limits limits = {}, OutputBudget* budget = nullptr)
      : session(state, limits, *this, {}, budget) {}
  void on_output() override { ++wakeups; }
  // Feeds bytes; returns whatever output is ready, consuming it.
  std::string send(const std::string& bytes) {
    EXPECT_TRUE(session.feed(bytes)) << session.error();
    return take();
  }
  std::string take() {
    std::string out(session.output());
    session.consume_output(out.size());
    return out;
  }
  Session session;
  int wakeups = 0;
};

inline std::string i64(int64_t v) {
  std::string s;
  wire::put_i64(s, v);
  return s;
}
inline std::string bytes(std::string_view v) {
  std::string s;
  wire::put_bytes(s, v);
  return s;
}

}  // namespace ddprun::store::test
