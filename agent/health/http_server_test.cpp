// HealthServer over real sockets on 127.0.0.1 (port 0): the io_context runs on its own thread,
// the test thread is the client (blocking sockets, see http_test_client.hpp).
#include "agent/health/http_server.hpp"

#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "agent/health/http_test_client.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;
using health_testing::request;
using health_testing::TestClient;
using namespace std::chrono_literals;

class HealthServerTest : public ::testing::Test {
 protected:
  HealthServerTest() : thread_([this] { io_.run(); }) {}
  ~HealthServerTest() override {
    on_io([this] { server_.reset(); });
    work_.reset();
    thread_.join();
  }

  // Runs f on the io_context thread and returns its result (or rethrows).
  template <class F>
  auto on_io(F f) -> decltype(f()) {
    auto task = std::make_shared<std::packaged_task<decltype(f())()>>(std::move(f));
    auto result = task->get_future();
    asio::post(io_, [task] { (*task)(); });
    return result.get();
  }

  void start(HealthServer::Limits limits = {}) {
    on_io([&] {
      server_ = std::make_unique<HealthServer>(
          io_, "127.0.0.1", 0, [this](std::string_view target) { return handle(target); }, limits);
    });
    port_ = server_->port();
  }

  size_t open_connections() {
    return on_io([this] { return server_->open_connections(); });
  }

  HttpResponse handle(std::string_view target) {
    targets_.emplace_back(target);
    if (target == "/throw") throw std::runtime_error("handler bug");
    if (target == "/quit") server_.reset();  // the server destroyed from inside its handler
    HttpResponse res;
    if (target == "/busy") res.status = 503;
    res.body = "hello from " + std::string(target) + "\n";
    return res;
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::unique_ptr<HealthServer> server_;
  std::vector<std::string> targets_;  // io thread only (read after on_io)
  int port_ = 0;
  std::thread thread_;  // last: starts once everything above exists
};

HealthServer::Limits short_timeouts() {
  HealthServer::Limits limits;
  limits.request_timeout = 300ms;
  limits.idle_timeout = 300ms;
  return limits;
}

TEST_F(HealthServerTest, GetReturnsTheHandlersBodyWithContentLength) {
  start();
  TestClient client(port_);
  ASSERT_TRUE(client.send(request("GET", "/health?verbose=1")));
  auto res = client.read_response();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "hello from /health\n");  // the handler saw no query string
  EXPECT_EQ(res->header("content-length"), std::to_string(res->body.size()));
  EXPECT_EQ(res->header("content-type"), "text/plain; charset=utf-8");
  EXPECT_EQ(res->header("cache-control"), "no-store");
}

TEST_F(HealthServerTest, KeepAliveServesRequestsOneAfterAnotherAndPipelined) {
  start();
  TestClient client(port_);
  ASSERT_TRUE(client.send(request("GET", "/a")));
  auto first = client.read_response();
  ASSERT_TRUE(client.send(request("GET", "/b")));
  auto second = client.read_response();
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->body, "hello from /a\n");
  EXPECT_EQ(second->body, "hello from /b\n");
  ASSERT_TRUE(client.send(request("GET", "/c") + request("GET", "/d")));
  auto third = client.read_response();
  auto fourth = client.read_response();
  ASSERT_TRUE(third && fourth);
  EXPECT_EQ(third->body, "hello from /c\n");
  EXPECT_EQ(fourth->body, "hello from /d\n");
  EXPECT_EQ(open_connections(), 1u);
}

TEST_F(HealthServerTest, HeadHasTheHeadersButNoBody) {
  start();
  TestClient client(port_);
  // Were a body sent after HEAD's headers, the GET's response would not parse.
  ASSERT_TRUE(client.send(request("HEAD", "/health") + request("GET", "/x")));
  auto head = client.read_response(/*head=*/true);
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->header("content-length"),
            std::to_string(std::string("hello from /health\n").size()));
  auto get = client.read_response();
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 200);
  EXPECT_EQ(get->body, "hello from /x\n");
}

TEST_F(HealthServerTest, OtherMethodsGet405WithAllow) {
  start();
  TestClient client(port_);
  ASSERT_TRUE(client.send(request("POST", "/health", "Content-Length: 0\r\n")));
  auto res = client.read_response();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 405);
  EXPECT_EQ(res->header("allow"), "GET, HEAD");
  EXPECT_EQ(res->header("cache-control"), "no-store");
  ASSERT_TRUE(client.send(request("GET", "/after")));  // the connection stays usable
  auto next = client.read_response();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->status, 200);
  EXPECT_EQ(on_io([this] { return targets_; }), std::vector<std::string>{"/after"});
}

TEST_F(HealthServerTest, ARequestWithABodyGets413AndTheConnectionCloses) {
  start();
  TestClient sized(port_);
  ASSERT_TRUE(sized.send(request("GET", "/health", "Content-Length: 5\r\n") + "hello"));
  auto res = sized.read_response();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  EXPECT_TRUE(sized.wait_closed());

  TestClient chunked(port_);
  ASSERT_TRUE(chunked.send(request("GET", "/health", "Transfer-Encoding: chunked\r\n") +
                           "5\r\nhello\r\n0\r\n\r\n"));
  res = chunked.read_response();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  EXPECT_TRUE(chunked.wait_closed());
  EXPECT_TRUE(on_io([this] { return targets_; }).empty());
}

TEST_F(HealthServerTest, ConnectionCloseIsHonoured) {
  start();
  TestClient client(port_);
  ASSERT_TRUE(client.send(request("GET", "/health", "Connection: close\r\n")));
  auto res = client.read_response();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->header("connection"), "close");
  EXPECT_TRUE(client.wait_closed());
}

TEST_F(HealthServerTest, HandlerStatusIsSentAndAThrowingHandlerGets500) {
  start();
  TestClient client(port_);
  ASSERT_TRUE(client.send(request("GET", "/busy")));
  auto busy = client.read_response();
  ASSERT_TRUE(client.send(request("GET", "/throw")));
  auto thrown = client.read_response();
  ASSERT_TRUE(busy && thrown);
  EXPECT_EQ(busy->status, 503);
  EXPECT_EQ(thrown->status, 500);
}

TEST_F(HealthServerTest, OversizedHeaderClosesTheConnection) {
  start();
  TestClient client(port_);
  std::string extra;
  while (extra.size() < 20 * 1024) extra += "X-Padding: " + std::string(100, 'a') + "\r\n";
  client.send(request("GET", "/health", extra));  // may fail midway once the server closes
  std::string received;
  EXPECT_TRUE(client.wait_closed(&received));
  if (!received.empty()) {
    EXPECT_TRUE(received.starts_with("HTTP/1.1 431 ")) << received;
  }
  EXPECT_TRUE(on_io([this] { return targets_; }).empty());
}

TEST_F(HealthServerTest, GarbageClosesTheConnectionAndTheServerGoesOn) {
  start();
  TestClient garbage(port_);
  ASSERT_TRUE(
      garbage.send(std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 15)));
  std::string received;
  EXPECT_TRUE(garbage.wait_closed(&received));
  EXPECT_EQ(received, "");

  TestClient client(port_);
  ASSERT_TRUE(client.send(request("GET", "/health")));
  auto res = client.read_response();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST_F(HealthServerTest, ASlowClientIsClosedWhileOthersAreServed) {
  start(short_timeouts());
  TestClient slow(port_);
  ASSERT_TRUE(slow.send("GET /hea"));  // and nothing more
  TestClient quick(port_);
  ASSERT_TRUE(quick.send(request("GET", "/health")));
  auto res = quick.read_response();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  std::string received;
  EXPECT_TRUE(slow.wait_closed(&received));
  EXPECT_EQ(received, "");
}

TEST_F(HealthServerTest, AnIdleKeepAliveConnectionIsClosed) {
  start(short_timeouts());
  TestClient client(port_);
  ASSERT_TRUE(client.send(request("GET", "/health")));
  ASSERT_TRUE(client.read_response());
  EXPECT_TRUE(client.wait_closed());
}

TEST_F(HealthServerTest, ANewConnectionBeyondTheLimitClosesTheLongestWaiting) {
  HealthServer::Limits limits;
  limits.request_timeout = 60s;  // generous: the test must not race the timeouts
  limits.idle_timeout = 60s;
  start(limits);
  std::vector<std::unique_ptr<TestClient>> clients;
  for (int i = 0; i < 64; ++i) {  // each served once: the server holds all 64
    clients.push_back(std::make_unique<TestClient>(port_));
    ASSERT_TRUE(clients.back()->send(request("GET", "/one")));
    ASSERT_TRUE(clients.back()->read_response());
  }
  EXPECT_EQ(open_connections(), 64u);
  // A probe gets its answer; the first client, idle longest, makes room.
  TestClient extra(port_);
  ASSERT_TRUE(extra.send(request("GET", "/extra")));
  auto probe = extra.read_response();
  ASSERT_TRUE(probe);
  EXPECT_EQ(probe->status, 200);
  EXPECT_TRUE(clients.front()->wait_closed());
  for (size_t i = 1; i < clients.size(); ++i) {
    ASSERT_TRUE(clients[i]->send(request("GET", "/two")));
    auto res = clients[i]->read_response();
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
  }
  EXPECT_EQ(open_connections(), 64u);
}

// Slowloris: connections that trickle a header that never ends fill the server; probes that
// come one after another are all answered.
TEST_F(HealthServerTest, ProbesAreAnsweredWhileSlowClientsFillTheServer) {
  HealthServer::Limits limits;
  limits.request_timeout = 60s;
  limits.idle_timeout = 60s;
  limits.max_connections = 16;
  start(limits);
  std::vector<std::unique_ptr<TestClient>> slow;
  for (int i = 0; i < 100; ++i) {
    slow.push_back(std::make_unique<TestClient>(port_));
    slow.back()->send("GET /slow HTTP/1.1\r\nX-Pad: ");
  }
  for (int i = 0; i < 20; ++i) {
    TestClient probe(port_);
    ASSERT_TRUE(probe.send(request("GET", "/healthz")));
    auto res = probe.read_response();
    ASSERT_TRUE(res) << "probe " << i;
    EXPECT_EQ(res->status, 200);
  }
  EXPECT_LE(open_connections(), 16u + 1);
}

TEST_F(HealthServerTest, DestroyingTheServerClosesEveryConnection) {
  start();
  TestClient served(port_);
  ASSERT_TRUE(served.send(request("GET", "/health")));
  ASSERT_TRUE(served.read_response());
  TestClient halfway(port_);
  ASSERT_TRUE(halfway.send("GET /hea"));
  TestClient silent(port_);
  on_io([this] { server_.reset(); });
  EXPECT_TRUE(served.wait_closed());
  EXPECT_TRUE(halfway.wait_closed());
  EXPECT_TRUE(silent.wait_closed());
  EXPECT_FALSE(TestClient::can_connect(port_));
}

TEST_F(HealthServerTest, TheHandlerMayDestroyTheServer) {
  start();
  TestClient client(port_);
  ASSERT_TRUE(client.send(request("GET", "/quit")));
  std::string received;
  EXPECT_TRUE(client.wait_closed(&received));
  EXPECT_EQ(received, "");  // its own request is not answered: the server is gone
  EXPECT_FALSE(on_io([this] { return server_ != nullptr; }));
}

TEST_F(HealthServerTest, BindingAPortInUseNamesTheEndpoint) {
  start();
  try {
    on_io([this] { HealthServer second(io_, "127.0.0.1", port_, nullptr); });
    FAIL() << "bound a port in use";
  } catch (const std::system_error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot serve health on 127.0.0.1:" + std::to_string(port_) +
                                         ": Address already in use");
  }
}

TEST_F(HealthServerTest, AHostThatIsNotAnAddressIsRefused) {
  EXPECT_THROW(on_io([this] { HealthServer bad(io_, "localhost", 0, nullptr); }),
               std::system_error);
  EXPECT_THROW(on_io([this] { HealthServer bad(io_, "127.0.0.1", 70000, nullptr); }),
               std::system_error);
}

}  // namespace
}  // namespace ddprun::agent
