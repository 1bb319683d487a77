#include "agent/rendezvous/workers_store_peers.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace ddprun::agent {
namespace {

namespace ip = boost::asio::ip;

bool has(const std::vector<ip::address>& list, const char* address) {
  return std::find(list.begin(), list.end(), ip::make_address(address)) != list.end();
}

TEST(WorkersStorePeersTest, LoopbackAndEveryMemberAddress) {
  std::vector<std::string> unresolved;
  auto peers =
      member_peers({"10.0.0.7", "fe80::1", "localhost", "no-such-host.invalid"}, &unresolved);
  EXPECT_TRUE(has(peers, "127.0.0.1"));
  EXPECT_TRUE(has(peers, "::1"));
  EXPECT_TRUE(has(peers, "10.0.0.7"));  // literals as they are
  EXPECT_TRUE(has(peers, "fe80::1"));
  EXPECT_FALSE(has(peers, "127.0.0.2"));  // loopback means where local clients come from
  EXPECT_EQ(unresolved, std::vector<std::string>{"no-such-host.invalid"});
  EXPECT_EQ(std::count(peers.begin(), peers.end(), ip::make_address("127.0.0.1")), 1);
}

TEST(WorkersStorePeersTest, ThisMachineIncludesLoopback) {
  auto peers = this_machine_peers();
  EXPECT_TRUE(has(peers, "127.0.0.1"));
  EXPECT_TRUE(has(peers, "::1"));
}

}  // namespace
}  // namespace ddprun::agent
