// Token authentication (AUTH / AUTH_PROOF) and the allow-list, through real sockets: the
// handshake of both clients, refusals on both sides, strangers closed while others are
// served, malformed AUTH frames, the rate-limited refusal log, and peers admitted by address.
#include "store/auth.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <future>
#include <thread>

#include "store/async_client.hpp"
#include "store/client.hpp"
#include "store/raw_client_test_util.hpp"
#include "store/refusal_log.hpp"
#include "store/server.hpp"
#include "store/test_frames.hpp"

namespace ddprun::store {
namespace {

using namespace std::chrono_literals;
using test::RawConn;
using test::str_bytes;
using test::torch2_hello;
using test::v1;
using test::v2;

constexpr const char* kToken = "s3cret-of-the-job";

ServerOptions with_token(std::string token = kToken) {
  ServerOptions o;
  o.host = "127.0.0.1";
  o.token = std::move(token);
  o.auth_timeout = 500ms;
  o.log_prefix = "[test store]";
  return o;
}

ClientOptions client_token(std::string token = kToken) {
  ClientOptions o;
  o.connect_timeout = 5s;
  o.timeout = 5s;
  o.token = std::move(token);
  return o;
}

size_t count(const std::string& log, const std::string& what) {
  size_t n = 0;
  for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
  return n;
}

AuthFailure auth_failure_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreError::Kind::kAuth) << e.what();
    return e.auth_failure();
  }
  ADD_FAILURE() << "no StoreError";
  return AuthFailure::kNone;
}

// A client that performs the exchange by hand: hello + AUTH; returns the server's nonce after
// checking its proof.
std::string challenge(RawConn& c, const std::string& client_nonce) {
  c.send(torch2_hello() + std::string(v2(Op::kAuth).str(client_nonce)));
  std::string reply = c.recv(1 + 2 * (8 + kAuthBytes));
  EXPECT_EQ(reply[0], static_cast<char>(kAuthChallenge));
  std::string server_nonce = reply.substr(9, kAuthBytes);
  EXPECT_TRUE(auth::same(reply.substr(9 + kAuthBytes + 8),
                         auth::server_proof(kToken, client_nonce, server_nonce)));
  return server_nonce;
}

TEST(AuthCryptoTest, ProofsDependOnTokenRoleAndBothNonces) {
  const std::string a(kAuthBytes, 'a'), b(kAuthBytes, 'b');
  EXPECT_EQ(auth::server_proof("t", a, b).size(), kAuthBytes);
  EXPECT_EQ(auth::server_proof("t", a, b), auth::server_proof("t", a, b));
  EXPECT_NE(auth::server_proof("t", a, b), auth::server_proof("u", a, b));
  EXPECT_NE(auth::server_proof("t", a, b), auth::server_proof("t", b, a));
  EXPECT_NE(auth::server_proof("t", a, b), auth::client_proof("t", a, b));  // no reflection
  EXPECT_NE(auth::nonce(), auth::nonce());
  EXPECT_TRUE(auth::same("abc", "abc"));
  EXPECT_FALSE(auth::same("abc", "abd"));
  EXPECT_FALSE(auth::same("abc", "abcd"));
}

TEST(AuthTest, BothClientsAuthenticateAndWork) {
  ServerThread server(with_token());
  auto c = Client::connect("127.0.0.1", server.port(), client_token());
  c->set("k", "v");
  EXPECT_EQ(c->get("k"), "v");

  boost::asio::io_context io;
  auto done = boost::asio::co_spawn(
      io,
      [&]() -> boost::asio::awaitable<std::string> {
        auto a = co_await AsyncClient::connect(io.get_executor(), "127.0.0.1", server.port(),
                                               client_token());
        co_return co_await a->get("k");
      },
      boost::asio::use_future);
  io.run();
  EXPECT_EQ(done.get(), "v");
}

TEST(AuthTest, WrongTokenOnTheClientIsCaughtByTheClient) {
  ServerThread server(with_token());
  testing::internal::CaptureStderr();
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(
      auth_failure_of([&] { Client::connect("127.0.0.1", server.port(), client_token("x")); }),
      AuthFailure::kServerUnproven);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);  // no retries until connect_timeout
  try {
    Client::connect("127.0.0.1", server.port(), client_token("x"));
  } catch (const StoreError& e) {
    EXPECT_EQ(std::string(e.what()), "the store at 127.0.0.1:" + std::to_string(server.port()) +
                                         " did not prove it knows the token");
  }
  // The store sees the client hang up on its proof: a wrong token on its side too. (A round
  // trip on a new connection: the hang-ups were read by then.)
  Client::connect("127.0.0.1", server.port(), client_token())->ping();
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find(": wrong token"), std::string::npos) << log;
}

TEST(AuthTest, WrongProofIsRefusedByTheServerAndLogged) {
  ServerThread server(with_token());
  testing::internal::CaptureStderr();
  RawConn c(server.port());
  const std::string client_nonce = auth::nonce();
  const std::string server_nonce = challenge(c, client_nonce);
  std::string wrong = auth::client_proof("not the token", server_nonce, client_nonce);
  c.send(std::string(v2(Op::kAuthProof).str(wrong)) + std::string(v2(Op::kPing).u32(1)));
  EXPECT_TRUE(c.closed_by_peer());
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("refused 127.0.0.1:" + std::to_string(c.local_port()) + ": wrong token"),
            std::string::npos)
      << log;

  RawConn good(server.port());  // the right proof is accepted, then the 2.x ops work
  const std::string n2 = auth::nonce();
  const std::string s2 = challenge(good, n2);
  good.send(std::string(v2(Op::kAuthProof).str(auth::client_proof(kToken, s2, n2))) +
            std::string(v2(Op::kPing).u32(5)));
  EXPECT_EQ(good.recv(5), std::string("\x01\x05\x00\x00\x00", 5));
}

// A store that proves it knows the token, then closes at the client's proof: what a client
// with a different token sees from a server that checks the proof.
TEST(AuthTest, ClientSeesItsProofRefused) {
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sys::UniqueFd listener(lfd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  socklen_t len = sizeof addr;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread fake([lfd] {
    sys::UniqueFd c(::accept(lfd, nullptr, nullptr));
    std::string in(5 + 1 + 8 + kAuthBytes, '\0');
    ASSERT_EQ(::recv(c.get(), in.data(), in.size(), MSG_WAITALL), static_cast<ssize_t>(in.size()));
    const std::string client_nonce = in.substr(14), server_nonce = auth::nonce();
    std::string reply(1, static_cast<char>(kAuthChallenge));
    reply +=
        str_bytes(server_nonce) + str_bytes(auth::server_proof(kToken, client_nonce, server_nonce));
    ::send(c.get(), reply.data(), reply.size(), MSG_NOSIGNAL);
    std::string proof(1 + 8 + kAuthBytes + 5, '\0');
    ::recv(c.get(), proof.data(), proof.size(), MSG_WAITALL);
  });
  EXPECT_EQ(
      auth_failure_of([&] { Client::connect("127.0.0.1", ntohs(addr.sin_port), client_token()); }),
      AuthFailure::kRefused);
  fake.join();
}

TEST(AuthTest, ClientWithATokenRefusesAnOpenStore) {
  ServerOptions open;
  open.host = "127.0.0.1";
  ServerThread server(open);
  try {
    Client::connect("127.0.0.1", server.port(), client_token());
    FAIL() << "connected";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.auth_failure(), AuthFailure::kServerOpen);
    EXPECT_EQ(std::string(e.what()), "the store at 127.0.0.1:" + std::to_string(server.port()) +
                                         " does not ask for a token (started without one?)");
  }
  // The open store is still open to everyone else.
  ClientOptions plain = client_token("");
  Client::connect("127.0.0.1", server.port(), plain)->ping();
}

TEST(AuthTest, ClientWithoutATokenLearnsWhyAtOnce) {
  ServerThread server(with_token());
  testing::internal::CaptureStderr();
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(auth_failure_of([&] { Client::connect("127.0.0.1", server.port(), client_token("")); }),
            AuthFailure::kTokenRequired);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find(": no token"), std::string::npos) << log;
}

TEST(AuthTest, StrangersAreClosedWhileAgentsAreServed) {
  ServerThread server(with_token());
  auto agent = Client::connect("127.0.0.1", server.port(), client_token());
  agent->set("k", "v");
  struct Case {
    const char* name;
    std::string bytes;
  };
  const std::string h = torch2_hello();
  std::vector<Case> cases = {
      {"torch 1.13 SET", v1(Op::kSet).str("/k").str("v")},
      {"torch 2.x hello + SET", h + std::string(v2(Op::kSet).str("/k").str("v"))},
      {"torch 2.x hello + PING", h + std::string(v2(Op::kPing).u32(7))},
      {"AUTH_PROOF first", h + std::string(v2(Op::kAuthProof).str(std::string(32, 'p')))},
      {"garbage", "GET / HTTP/1.1\r\n\r\n"},
      {"nonce too short", h + std::string(v2(Op::kAuth).str(std::string(31, 'n')))},
      {"nonce length huge", h + std::string(v2(Op::kAuth).u64(1ull << 40))},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RawConn stranger(server.port());
    stranger.send(c.bytes);
    EXPECT_TRUE(stranger.closed_by_peer(5s));
    EXPECT_EQ(agent->get("k"), "v");
  }
  // A stranger sending SET never changed anything.
  EXPECT_EQ(agent->num_keys(), 1);
}

TEST(AuthTest, PingWithoutAuthGetsTheAuthWordThenTheClose) {
  ServerThread server(with_token());
  RawConn c(server.port());
  c.send(torch2_hello() + std::string(v2(Op::kPing).u32(7)));
  EXPECT_EQ(c.recv(4), std::string("AUTH"));
  EXPECT_TRUE(c.closed_by_peer());
}

TEST(AuthTest, MalformedOrTruncatedAuthClosesOnlyThatConnection) {
  ServerThread server(with_token());
  auto agent = Client::connect("127.0.0.1", server.port(), client_token());
  testing::internal::CaptureStderr();
  {  // truncated AUTH: closed by the authentication deadline, not held open forever
    RawConn c(server.port());
    c.send(torch2_hello() + std::string(v2(Op::kAuth).str(std::string(32, 'n'))).substr(0, 20));
    EXPECT_TRUE(c.closed_by_peer(5s));
  }
  {  // silent connection: the same
    RawConn c(server.port());
    EXPECT_TRUE(c.closed_by_peer(5s));
  }
  {  // a proof of the wrong length after a good AUTH
    RawConn c(server.port());
    challenge(c, auth::nonce());
    c.send(v2(Op::kAuthProof).str("short"));
    EXPECT_TRUE(c.closed_by_peer(5s));
  }
  {  // challenged, then something other than AUTH_PROOF
    RawConn c(server.port());
    challenge(c, auth::nonce());
    c.send(v2(Op::kGetNumKeys));
    EXPECT_TRUE(c.closed_by_peer(5s));
  }
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find(": malformed AUTH"), std::string::npos) << log;
  agent->ping();
  EXPECT_EQ(agent->num_keys(), 0);
}

TEST(AuthTest, AuthenticatedClientCannotAuthenticateAgain) {
  ServerThread server(with_token());
  RawConn c(server.port());
  const std::string n = auth::nonce();
  const std::string s = challenge(c, n);
  c.send(v2(Op::kAuthProof).str(auth::client_proof(kToken, s, n)));
  EXPECT_EQ(c.recv(1), std::string(1, '\x01'));
  testing::internal::CaptureStderr();
  c.send(v2(Op::kAuth).str(auth::nonce()));
  EXPECT_TRUE(c.closed_by_peer());
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("AUTH on a connection that has authenticated"), std::string::npos) << log;
}

TEST(AuthTest, RefusalsAreLoggedAtMostOncePerSecondPerReason) {
  ServerThread server(with_token());
  testing::internal::CaptureStderr();
  for (int i = 0; i < 30; ++i) {
    RawConn c(server.port());
    c.send(v1(Op::kSet).str("/k").str("v"));
    EXPECT_TRUE(c.closed_by_peer());
  }
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_GE(count(log, ": no token"), 1u) << log;
  EXPECT_LE(count(log, ": no token"), 10u) << log;  // 30 refusals, however slow the machine
}

TEST(RefusalLogTest, HoldsBackAndCountsWithinASecond) {
  RefusalLog log("[test]");
  auto t = RefusalLog::Clock::now();
  testing::internal::CaptureStderr();
  EXPECT_TRUE(log.refused("1.2.3.4:5", "no token", t));
  EXPECT_FALSE(log.refused("1.2.3.4:6", "no token", t + 100ms));
  EXPECT_FALSE(log.refused("1.2.3.4:7", "no token", t + 900ms));
  EXPECT_TRUE(log.refused("1.2.3.4:8", "wrong token", t + 900ms));  // its own budget
  EXPECT_TRUE(log.refused("1.2.3.4:9", "no token", t + 1100ms));
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("refused 1.2.3.4:5: no token\n"), std::string::npos) << out;
  EXPECT_NE(out.find("refused 1.2.3.4:8: wrong token\n"), std::string::npos) << out;
  EXPECT_NE(out.find("refused 1.2.3.4:9: no token (and 2 more for the same reason"),
            std::string::npos)
      << out;
  EXPECT_EQ(count(out, "\n"), 3u) << out;
}

}  // namespace
}  // namespace ddprun::store
