// CheckpointReplicas over real sockets on loopback, two or three "nodes" in one io_context: a
// save is pushed to the successor, a replacement node restores the dead node's state from its
// peer, two nodes that swap ranks swap states, a file its saver still holds is sent once it is
// let go, and requests of another job or malformed ones get nothing.
// tests/recovery/test_memory_replication.py runs it with real agents and torch.
#include "agent/checkpoint_replicas.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>

#include "store/sys/fd.hpp"
#include "store/sys/temp_dir.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// As a saver does: a temp file renamed into place.
void save(const std::string& dir, const std::string& name, const std::string& content) {
  const std::string temp = dir + "/." + name + ".123.tmp";
  std::ofstream(temp) << content;
  fs::rename(temp, dir + "/" + name);
}

class ReplicasTest : public ::testing::Test {
 protected:
  // Runs the io_context until `done` holds (or 20 s pass).
  bool run_until(const std::function<bool()>& done,
                 std::chrono::steady_clock::duration limit = 20s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io_.run_for(10ms);
      io_.restart();
    }
    return done();
  }
  void form_all(std::vector<std::pair<CheckpointReplicas*, int>> nodes, int round) {
    std::vector<ReplicaPeer> peers(nodes.size());
    for (auto& [r, rank] : nodes) peers[static_cast<size_t>(rank)] = {"127.0.0.1", r->port()};
    std::vector<char> done(nodes.size(), 0);
    for (size_t i = 0; i < nodes.size(); ++i) {
      asio::co_spawn(io_, nodes[i].first->round_formed(nodes[i].second, round, peers),
                     [&done, i](std::exception_ptr e) {
                       EXPECT_FALSE(e);
                       done[i] = 1;
                     });
    }
    ASSERT_TRUE(run_until([&] {
      for (char d : done) {
        if (!d) return false;
      }
      return true;
    }));
  }
  std::unique_ptr<CheckpointReplicas> node(const sys::TempDir& dir) {
    return std::make_unique<CheckpointReplicas>(io_, dir.path(), uint64_t{1} << 30, "job-1");
  }

  asio::io_context io_;
};

TEST_F(ReplicasTest, ASaveReachesTheSuccessorAndAReplacementNodeRestoresIt) {
  sys::TempDir da("ddprun_replicas_a"), db("ddprun_replicas_b"), dc("ddprun_replicas_c");
  auto a = node(da), b = node(db);
  form_all({{a.get(), 0}, {b.get(), 1}}, 0);
  save(da.path(), "rank0.pt", "state of rank 0, step 10");
  save(db.path(), "rank1.pt", "state of rank 1, step 10");
  const fs::path on_b = fs::path(db.path()) / ".replicas" / "0" / "rank0.pt";
  const fs::path on_a = fs::path(da.path()) / ".replicas" / "1" / "rank1.pt";
  ASSERT_TRUE(run_until([&] { return fs::exists(on_b) && fs::exists(on_a); }));
  EXPECT_EQ(read(on_b), "state of rank 0, step 10");
  EXPECT_EQ(read(fs::path(db.path()) / ".replicas" / "0" / ".round"), "0\n");
  // A newer save of the same name replaces the replica.
  save(da.path(), "rank0.pt", "state of rank 0, step 11");
  ASSERT_TRUE(run_until([&] { return read(on_b) == "state of rank 0, step 11"; }));

  // Node 0 dies with its memory; a new node takes rank 0 in round 1 and gets its state from
  // node 1, which keeps its own.
  a.reset();
  auto c = node(dc);
  form_all({{c.get(), 0}, {b.get(), 1}}, 1);
  EXPECT_EQ(read(fs::path(dc.path()) / "rank0.pt"), "state of rank 0, step 11");
  EXPECT_EQ(read(fs::path(db.path()) / "rank1.pt"), "state of rank 1, step 10");
  EXPECT_FALSE(fs::exists(fs::path(dc.path()) / "rank1.pt"));
  // And its saves go to node 1 from now on, under round 1.
  save(dc.path(), "rank0.pt", "state of rank 0, step 12");
  ASSERT_TRUE(run_until([&] { return read(on_b) == "state of rank 0, step 12"; }));
  EXPECT_EQ(read(fs::path(db.path()) / ".replicas" / "0" / ".round"), "1\n");
}

TEST_F(ReplicasTest, NodesThatSwapRanksSwapStates) {
  sys::TempDir da("ddprun_replicas_a"), db("ddprun_replicas_b");
  auto a = node(da), b = node(db);
  form_all({{a.get(), 0}, {b.get(), 1}}, 0);
  save(da.path(), "shard.pt", "shard 0");
  save(db.path(), "shard.pt", "shard 1");
  ASSERT_TRUE(run_until([&] {
    return fs::exists(fs::path(da.path()) / ".replicas" / "1" / "shard.pt") &&
           fs::exists(fs::path(db.path()) / ".replicas" / "0" / "shard.pt");
  }));
  form_all({{a.get(), 1}, {b.get(), 0}}, 1);
  EXPECT_EQ(read(fs::path(da.path()) / "shard.pt"), "shard 1");
  EXPECT_EQ(read(fs::path(db.path()) / "shard.pt"), "shard 0");
}

// The Python module's saver keeps an exclusive flock on its file from before it writes it until
// after it is in place; the push waits for it to let go, and never sends a file half written.
TEST_F(ReplicasTest, AFileItsSaverStillHoldsIsSentOnceLetGo) {
  sys::TempDir da("ddprun_replicas_a"), db("ddprun_replicas_b");
  auto a = node(da), b = node(db);
  form_all({{a.get(), 0}, {b.get(), 1}}, 0);
  const std::string temp = da.path() + "/.state.pt.123.tmp";
  std::ofstream(temp) << "half of it";
  sys::UniqueFd held(::open(temp.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_EQ(::flock(held.get(), LOCK_EX | LOCK_NB), 0);
  fs::rename(temp, da.path() + "/state.pt");
  const fs::path on_b = fs::path(db.path()) / ".replicas" / "0" / "state.pt";
  EXPECT_FALSE(run_until([&] { return fs::exists(on_b); }, 300ms));
  ASSERT_EQ(::pwrite(held.get(), "all of it!", 10, 0), 10);
  held.reset();
  ASSERT_TRUE(run_until([&] { return fs::exists(on_b); }));
  EXPECT_EQ(read(on_b), "all of it!");
}

TEST_F(ReplicasTest, AnotherJobAndMalformedRequestsGetNothing) {
  sys::TempDir da("ddprun_replicas_a"), db("ddprun_replicas_b");
  auto a = node(da);
  auto other = std::make_unique<CheckpointReplicas>(io_, db.path(), uint64_t{1} << 30, "job-2");
  form_all({{a.get(), 0}, {other.get(), 1}}, 0);
  save(da.path(), "rank0.pt", "secret");
  // The push to a server of another job is refused: nothing lands there.
  run_until([] { return false; }, 2500ms);  // a few pushes (one a second) are refused
  EXPECT_FALSE(fs::exists(fs::path(db.path()) / ".replicas"));

  // Raw requests: another job's GET and a malformed line are closed without an answer.
  for (std::string request : {std::string(R"({"op":"get","job":"job-2","rank":0})") + "\n",
                              std::string("not json\n"), std::string(5000, 'x') + "\n"}) {
    asio::ip::tcp::socket s(io_);
    s.connect({asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(a->port())});
    asio::write(s, asio::buffer(request));
    std::string answer;
    bool closed = false;
    asio::co_spawn(
        io_,
        [&]() -> asio::awaitable<void> {
          char buf[64];
          boost::system::error_code ec;
          for (;;) {
            size_t n = co_await s.async_read_some(asio::buffer(buf),
                                                  asio::redirect_error(asio::use_awaitable, ec));
            if (ec) break;
            answer.append(buf, n);
          }
          closed = true;
        },
        asio::detached);
    ASSERT_TRUE(run_until([&] { return closed; })) << request.substr(0, 40);
    EXPECT_EQ(answer, "") << request.substr(0, 40);
  }
}

}  // namespace
}  // namespace ddprun::agent
