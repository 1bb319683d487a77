// The Asio server through real sockets: framing across reads, ordering, bad input, limits,
// binding, many connections, slow readers and shutdown.
#include "store/server.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <memory>
#include <system_error>
#include <thread>

#include "store/raw_client_test_util.hpp"
#include "store/test_frames.hpp"

namespace ddprun::store {
namespace {

using test::i64_bytes;
using test::RawConn;
using test::str_bytes;
using test::torch2_hello;
using test::v1;
using test::v2;

ServerOptions loopback(uint16_t port = 0) {
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  return o;
}

class ServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<RawConn> torch2() {
    auto c = std::make_unique<RawConn>(server_.port());
    c->send(torch2_hello() + std::string(v2(Op::kPing).u32(7)));
    EXPECT_EQ(c->recv(4), std::string("\x07\x00\x00\x00", 4));
    return c;
  }
  ServerThread server_{loopback()};
};

TEST_F(ServerTest, Torch1FrameSentOneByteAtATime) {
  RawConn c(server_.port());
  std::string set = v1(Op::kSet).str("/key").str("value");
  for (char b : set) c.send(std::string_view(&b, 1));
  c.send(v1(Op::kGet).str("/key"));
  EXPECT_EQ(c.recv(13), str_bytes("value"));
}

TEST_F(ServerTest, PipelinedBurstBeyondTheSmallBuffer) {
  auto c = torch2();
  std::string burst;
  for (int i = 0; i < 3000; ++i) {
    burst += v2(Op::kAdd).str("counter").i64(1);
    std::string key = std::to_string(i);  // ("k" + to_string() trips GCC 12's -Wrestrict)
    burst += v2(Op::kSet).str(key).str(std::string(100, 'x'));
  }
  burst += v2(Op::kGetNumKeys);
  c->send(burst);
  std::string replies = c->recv(3000 * 8 + 8);
  EXPECT_EQ(replies.substr(0, 8), i64_bytes(1));
  EXPECT_EQ(replies.substr(2999 * 8, 8), i64_bytes(3000));
  EXPECT_EQ(replies.substr(3000 * 8), i64_bytes(3001));
}

TEST_F(ServerTest, LargeValuesRoundTrip) {
  auto c = torch2();
  std::string value(8 << 20, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 7);
  c->send(v2(Op::kSet).str("big").str(value));
  c->send(v2(Op::kGet).str("big"));
  EXPECT_TRUE(c->recv(8 + value.size()) == str_bytes(value));
}

TEST_F(ServerTest, ClientThatDoesNotReadIsThrottledNotDropped) {
  auto slow = torch2();
  auto other = torch2();
  slow->send(v2(Op::kSet).str("v").str(std::string(1 << 20, 'v')));
  slow->send(v2(Op::kGetNumKeys));
  ASSERT_EQ(slow->recv(8), i64_bytes(1));
  std::string gets;
  for (int i = 0; i < 48; ++i) gets += v2(Op::kGet).str("v");
  std::thread writer([&] { slow->send(gets); });  // blocks once both socket buffers fill
  other->send(v2(Op::kGetNumKeys));
  EXPECT_EQ(other->recv(8), i64_bytes(1));  // the server still serves others meanwhile
  std::string expected = str_bytes(std::string(1 << 20, 'v'));
  for (int i = 0; i < 48; ++i) ASSERT_TRUE(slow->recv(expected.size()) == expected) << i;
  writer.join();
}

TEST_F(ServerTest, CancelWaitRaceGivesZeroThenOne) {
  auto waiter = torch2();
  auto setter = torch2();
  waiter->send(v2(Op::kWait).keys({"k"}));
  setter->send(v2(Op::kSet).str("k").str("v"));
  setter->send(v2(Op::kGetNumKeys));
  EXPECT_EQ(setter->recv(8), i64_bytes(1));  // the SET has been applied: 0x00 is queued
  waiter->send(v2(Op::kCancelWait));
  EXPECT_EQ(waiter->recv(2), std::string("\x00\x01", 2));
}

TEST_F(ServerTest, CancelWaitBeforeReleaseGivesOnlyOne) {
  auto waiter = torch2();
  auto setter = torch2();
  waiter->send(v2(Op::kWait).keys({"k"}));
  waiter->send(v2(Op::kCancelWait));
  EXPECT_EQ(waiter->recv(1), std::string(1, '\x01'));
  setter->send(v2(Op::kSet).str("k").str("v"));
  waiter->send(v2(Op::kPing).u32(9));
  EXPECT_EQ(waiter->recv(4), std::string("\x09\x00\x00\x00", 4));  // no stray 0x00 before it
}

TEST_F(ServerTest, Torch1RequestAfterTimedOutWaitGetsNoLateByte) {
  RawConn waiter(server_.port()), setter(server_.port());
  waiter.send(v1(Op::kWait).keys({"/k"}));
  waiter.send(v1(Op::kGetNumKeys));  // the client gave up waiting and moved on
  EXPECT_EQ(waiter.recv(8), i64_bytes(0));
  setter.send(v1(Op::kSet).str("/k").str("v"));
  setter.send(v1(Op::kGetNumKeys));
  EXPECT_EQ(setter.recv(8), i64_bytes(1));
  waiter.send(v1(Op::kGetNumKeys));
  EXPECT_EQ(waiter.recv(8), i64_bytes(1));  // not 0x00 followed by half a reply
}

TEST_F(ServerTest, ThousandWaitersReleasedByOneSet) {
  std::vector<std::unique_ptr<RawConn>> waiters;
  for (int i = 0; i < 1000; ++i) {
    waiters.push_back(std::make_unique<RawConn>(server_.port()));
    waiters.back()->send(i % 2 ? std::string(v1(Op::kWait).keys({"/go"}))
                               : torch2_hello() + std::string(v2(Op::kWait).keys({"/go"})));
  }
  RawConn setter(server_.port());
  setter.send(v1(Op::kSet).str("/go").str("1"));
  for (auto& w : waiters) ASSERT_EQ(w->recv(1), std::string(1, '\x00'));
}

// One SET releasing more waiters than the server sends on its own thread (the fan-out path),
// some of which hung up abruptly while parked: the rest get their byte, the server serves on.
TEST_F(ServerTest, MassReleaseWithVanishedWaitersReachesEveryOther) {
  std::vector<std::unique_ptr<RawConn>> waiters;
  for (int i = 0; i < 300; ++i) {
    waiters.push_back(std::make_unique<RawConn>(server_.port()));
    waiters.back()->send(torch2_hello() + std::string(v2(Op::kWait).keys({"/mass"})));
  }
  auto probe = torch2();
  probe->send(v2(Op::kGetNumKeys));  // every WAIT above is parked once this is answered
  EXPECT_EQ(probe->recv(8), i64_bytes(0));
  for (size_t i = 0; i < waiters.size(); i += 10) {
    linger hard{1, 0};  // close with RST
    ::setsockopt(waiters[i]->fd(), SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    waiters[i].reset();
  }
  probe->send(v2(Op::kSet).str("/mass").str("1"));
  for (auto& w : waiters) {
    if (w) {
      ASSERT_EQ(w->recv(1), std::string(1, '\x00'));
    }
  }
  probe->send(v2(Op::kPing).u32(3));
  EXPECT_EQ(probe->recv(4), std::string("\x03\x00\x00\x00", 4));
}

// A client that sends its last request and shuts down its side in one go (data and FIN read
// by the same wake-up) gets the reply, then the server closes its end.
TEST_F(ServerTest, RequestWithTheFinGetsItsReplyThenTheConnectionEnds) {
  for (int i = 0; i < 20; ++i) {
    RawConn c(server_.port());
    c.send(torch2_hello() + std::string(v2(Op::kPing).u32(9)));
    ASSERT_EQ(::shutdown(c.fd(), SHUT_WR), 0);
    EXPECT_EQ(c.recv(4), std::string("\x09\x00\x00\x00", 4));
    EXPECT_TRUE(c.closed_by_peer(std::chrono::seconds(5)));
  }
}

struct BadCase {
  const char* name;
  std::string bytes;
  const char* reason;
};

TEST_F(ServerTest, BadInputClosesOnlyThatConnectionWithALogLine) {
  auto bystander = torch2();
  std::string h = torch2_hello();
  auto setter = torch2();
  setter->send(v2(Op::kSet).str("text").str("abc"));
  std::vector<BadCase> cases = {
      {"unknown 1.13 opcode", "\x0E", "unknown opcode 0x0E in the torch-1.13 dialect"},
      {"unknown 2.x opcode", h + "\x7F", "unknown opcode 0x7F in the torch-2.x dialect"},
      {"key too long", h + std::string(v2(Op::kGet).u64(9000)), "GET key of 9000 bytes"},
      {"value too long", v1(Op::kSet).str("k").u64(1ull << 33), "SET value of 8589934592"},
      {"too many keys", h + std::string(v2(Op::kWait).u64(1 << 20)), "WAIT with 1048576 keys"},
      {"ADD on text", v1(Op::kAdd).str("text").i64(1), "ADD 1 on key 'text'"},
      {"bad magic", h + std::string(v2(Op::kValidate).u32(1)), "VALIDATE with a wrong magic"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    testing::internal::CaptureStderr();
    RawConn bad(server_.port());
    bad.send(c.bytes);
    EXPECT_TRUE(bad.closed_by_peer());
    std::string log = testing::internal::GetCapturedStderr();
    EXPECT_NE(log.find("closing connection from 127.0.0.1:"), std::string::npos) << log;
    EXPECT_NE(log.find(c.reason), std::string::npos) << log;
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
    bystander->send(v2(Op::kPing).u32(1));
    EXPECT_EQ(bystander->recv(4), std::string("\x01\x00\x00\x00", 4));
  }
}

TEST_F(ServerTest, ClientClosingWhileParkedIsForgotten) {
  {
    RawConn gone(server_.port());
    gone.send(v1(Op::kWait).keys({"/k"}));
    gone.send(v1(Op::kGetNumKeys));
    gone.recv(8);
    gone.send(v1(Op::kWait).keys({"/k"}));
  }
  auto c = torch2();
  c->send(v2(Op::kSet).str("/k").str("v"));
  c->send(v2(Op::kGetNumKeys));
  EXPECT_EQ(c->recv(8), i64_bytes(1));
}

TEST(ServerBindTest, PortZeroIsReportedAndPortInUseIsAClearError) {
  ServerThread first(loopback());
  ASSERT_NE(first.port(), 0);
  try {
    ServerThread second(loopback(first.port()));
    FAIL() << "bound the same port twice";
  } catch (const std::system_error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot listen on 127.0.0.1:" + std::to_string(first.port()) +
                                         ": Address already in use");
  }
}

TEST(ServerBindTest, BadHostIsAClearError) {
  ServerOptions o;
  o.host = "no-such-host.invalid";
  try {
    ServerThread s(o);
    FAIL() << "bound a bad host";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on no-such-host.invalid:0"),
              std::string::npos)
        << e.what();
  }
}

TEST(ServerBindTest, DualStackAnyAcceptsIpv4) {
  ServerOptions o;
  o.host = "::";
  std::unique_ptr<ServerThread> s;
  try {
    s = std::make_unique<ServerThread>(o);
  } catch (const std::system_error& e) {
    GTEST_SKIP() << "no IPv6 here: " << e.what();
  }
  RawConn c(s->port(), "127.0.0.1");
  c.send(v1(Op::kGetNumKeys));
  EXPECT_EQ(c.recv(8), i64_bytes(0));
}

TEST(ServerLifetimeTest, DestroyingTheServerClosesEveryConnection) {
  auto server = std::make_unique<ServerThread>(loopback());
  RawConn idle(server->port()), parked(server->port());
  parked.send(v1(Op::kWait).keys({"/never"}));
  parked.send(v1(Op::kWait).keys({"/never"}));  // (1.13: replaces the first)
  idle.send(v1(Op::kGetNumKeys));
  idle.recv(8);
  server.reset();
  EXPECT_TRUE(idle.closed_by_peer());
  EXPECT_TRUE(parked.closed_by_peer());
}

TEST(ServerLifetimeTest, PortCanBeReboundRightAfterClose) {
  uint16_t port;
  {
    ServerThread first(loopback());
    port = first.port();
    RawConn c(port);
    c.send(v1(Op::kSet).str("/k").str("v"));
    c.send(v1(Op::kGetNumKeys));
    EXPECT_EQ(c.recv(8), i64_bytes(1));
  }  // the server closes its end first: its side of the connection sits in TIME_WAIT
  ServerThread again(loopback(port));
  RawConn c(port);
  c.send(v1(Op::kGetNumKeys));
  EXPECT_EQ(c.recv(8), i64_bytes(0));  // a fresh store
}

TEST(ServerLifetimeTest, ServerOnACallersIoContext) {
  boost::asio::io_context io;
  auto server = std::make_unique<Server>(io, loopback());
  std::thread runner([&] { io.run(); });
  RawConn a(server->port()), b(server->port());
  a.send(v1(Op::kGetNumKeys));
  a.recv(8);
  b.send(v1(Op::kGetNumKeys));
  b.recv(8);
  size_t count = 0;
  boost::asio::post(io, [&] {
    count = server->connection_count();
    server->close();
  });
  runner.join();  // close() cancels everything: run() returns by itself
  EXPECT_EQ(count, 2u);
  EXPECT_TRUE(a.closed_by_peer());
  server.reset();  // after the io_context stopped: still safe
}

}  // namespace
}  // namespace ddprun::store
