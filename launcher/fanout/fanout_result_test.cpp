#include "launcher/fanout/fanout_result.hpp"

#include <gtest/gtest.h>

namespace ddprun::launcher {
namespace {

using agent::ExitStatus;

NodeEnd end(const char* host, int rank, ExitStatus st, bool stopped = false) {
  return {host, rank, st, stopped};
}

TEST(FanoutResult, Table) {
  const auto ok = ExitStatus::exited(0);
  struct Case {
    std::vector<NodeEnd> ends;
    std::optional<int> signal;
    int code;
    const char* line;
  } cases[] = {
      {{end("a", 0, ok), end("b", 1, ok)}, std::nullopt, 0, ""},
      // b's worker exited 3; a saw "failed on another node" first and exited 1.
      {{end("a", 0, ExitStatus::exited(1)), end("b", 1, ExitStatus::exited(3))},
       std::nullopt,
       3,
       "node 1 (b) exited with 3"},
      // a ended first (1: failed on another node); b was told to stop but was already
      // failing with its worker's 7: b is the failing node.
      {{end("a", 0, ExitStatus::exited(1)), end("b", 1, ExitStatus::exited(7), true)},
       std::nullopt,
       7,
       "node 1 (b) exited with 7"},
      // Everyone says 1: the first to say it.
      {{end("b", 1, ExitStatus::exited(1)), end("a", 0, ExitStatus::exited(1), true)},
       std::nullopt,
       1,
       "node 1 (b) exited with 1"},
      // A node we stopped (143 from our EOF) is never the root cause.
      {{end("b", 1, ExitStatus::exited(7)), end("a", 0, ExitStatus::exited(143), true)},
       std::nullopt,
       7,
       "node 1 (b) exited with 7"},
      // ssh itself failed.
      {{end("b", 1, ExitStatus::exited(255)), end("a", 0, ExitStatus::exited(1), true)},
       std::nullopt,
       255,
       "ssh failed"},
      // The ssh client was killed from outside.
      {{end("b", 1, ExitStatus::signaled(9)), end("a", 0, ExitStatus::exited(143), true)},
       std::nullopt,
       137,
       "node 1 (b) was killed by SIGKILL"},
      // Our own signal wins.
      {{end("a", 0, ExitStatus::exited(143), true), end("b", 1, ExitStatus::exited(143), true)},
       15,
       143,
       "received SIGTERM"},
      {{end("a", 0, ExitStatus::exited(130), true)}, 2, 130, "received SIGINT"},
  };
  for (const auto& c : cases) {
    FanoutResult r = fanout_result(c.ends, c.signal);
    EXPECT_EQ(r.code, c.code) << c.line;
    EXPECT_NE(r.line.find(c.line), std::string::npos) << r.line;
  }
}

}  // namespace
}  // namespace ddprun::launcher
