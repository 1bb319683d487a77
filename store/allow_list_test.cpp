// The store's allow-list of peers (Server::set_allowed_peers): strangers refused and logged,
// admitted once listed, IPv4-mapped IPv6 peers matched as IPv4.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "store/raw_client_test_util.hpp"
#include "store/server.hpp"
#include "store/test_frames.hpp"

namespace ddprun::store {
namespace {

using namespace std::chrono_literals;
using test::RawConn;
using test::v1;

// The allow-list, on a Server on the test's own io_context (its methods run on that thread).
class AllowListTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.host = host_;
    o.log_prefix = "[test store]";
    try {
      server_ = std::make_unique<Server>(io_, o);
    } catch (const std::system_error& e) {
      GTEST_SKIP() << "cannot listen on " << host_ << ": " << e.what();
    }
    runner_ = std::thread([this] {
      auto guard = boost::asio::make_work_guard(io_);
      io_.run();
    });
  }
  void TearDown() override {
    if (!server_) return;
    boost::asio::post(io_, [this] {
      server_->close();
      io_.stop();
    });
    runner_.join();
  }
  void allow(std::vector<std::string> addrs, std::string reason) {
    std::vector<boost::asio::ip::address> list;
    for (const auto& a : addrs) list.push_back(boost::asio::ip::make_address(a));
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      server_->set_allowed_peers(list, reason);
      done.set_value();
    });
    done.get_future().wait();
  }
  static bool works(RawConn& c) {
    c.send(v1(Op::kGetNumKeys));
    return c.recv(8).size() == 8;
  }

  std::string host_ = "127.0.0.1";
  boost::asio::io_context io_;
  std::unique_ptr<Server> server_;
  std::thread runner_;
};

TEST_F(AllowListTest, RefusesOthersAndAdmitsThemOnceListed) {
  allow({"127.0.0.1"}, "not a member of round 3");
  RawConn local(server_->port());
  EXPECT_TRUE(works(local));
  testing::internal::CaptureStderr();
  RawConn stranger(server_->port(), "127.0.0.1", "127.0.0.2");
  EXPECT_TRUE(stranger.closed_by_peer());
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("refused 127.0.0.2:" + std::to_string(stranger.local_port()) +
                     ": not a member of round 3"),
            std::string::npos)
      << log;
  EXPECT_TRUE(works(local));  // the others are still served

  allow({"127.0.0.1", "127.0.0.2"}, "not a member of round 4");
  RawConn member(server_->port(), "127.0.0.1", "127.0.0.2");
  EXPECT_TRUE(works(member));

  testing::internal::CaptureStderr();
  allow({"127.0.0.2"}, "not a member of round 5");  // narrowed: open connections are closed
  EXPECT_TRUE(local.closed_by_peer());
  log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("refused 127.0.0.1:"), std::string::npos) << log;
  EXPECT_TRUE(works(member));
}

class DualStackAllowListTest : public AllowListTest {
 protected:
  DualStackAllowListTest() { host_ = "::"; }
};

TEST_F(DualStackAllowListTest, MappedIpv4PeersCountAsIpv4) {
  allow({"127.0.0.1"}, "not listed");  // an IPv4 peer shows up as ::ffff:127.0.0.1
  RawConn local(server_->port());
  EXPECT_TRUE(works(local));
  testing::internal::CaptureStderr();
  RawConn stranger(server_->port(), "127.0.0.1", "127.0.0.2");
  EXPECT_TRUE(stranger.closed_by_peer());
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("refused 127.0.0.2:"), std::string::npos) << log;  // not ::ffff:...
  allow({"::ffff:127.0.0.2"}, "not listed");  // and a mapped entry matches the IPv4 peer
  RawConn now(server_->port(), "127.0.0.1", "127.0.0.2");
  EXPECT_TRUE(works(now));
}

}  // namespace
}  // namespace ddprun::store
