#include "launcher/launch_kind.hpp"

#include <gtest/gtest.h>

#include "launcher/bind_hosts.hpp"
#include "launcher/cli_parser.hpp"

namespace ddprun::launcher {
namespace {

LaunchClass classify(std::vector<std::string> args) {
  args.push_back("train");
  GetEnv no_env = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  return classify_launch(parse_command_line(args, no_env));
}

LaunchKind kind_of(std::vector<std::string> args) {
  return classify(std::move(args)).kind;
}

std::string error_of(std::vector<std::string> args) {
  try {
    classify(std::move(args));
  } catch (const CliError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(LaunchKind, Standalone) {
  EXPECT_EQ(kind_of({"--standalone"}), LaunchKind::kStandalone);
  // --standalone wins over the rendezvous flags on one node.
  EXPECT_EQ(kind_of({"--standalone", "--rdzv_backend=c10d", "--rdzv_endpoint=otherhost:1"}),
            LaunchKind::kStandalone);
}

TEST(LaunchKind, SingleNodeStatic) {
  auto dflt = classify({});
  EXPECT_EQ(dflt.kind, LaunchKind::kSingleNodeStatic);
  EXPECT_EQ(dflt.endpoint.host, "127.0.0.1");
  EXPECT_FALSE(dflt.endpoint.port);  // a free port
  auto fixed = classify({"--master_addr=node0", "--master_port=29511"});
  EXPECT_EQ(fixed.kind, LaunchKind::kSingleNodeStatic);
  EXPECT_EQ(fixed.endpoint.host, "node0");
  EXPECT_EQ(fixed.endpoint.port, 29511);
  // --rdzv-endpoint overrides --master-addr/--master-port.
  auto ep = classify({"--master_port=1", "--rdzv_endpoint=[fd00::1]:29512"});
  EXPECT_EQ(ep.kind, LaunchKind::kSingleNodeStatic);
  EXPECT_EQ(ep.endpoint.host, "fd00::1");
  EXPECT_EQ(ep.endpoint.port, 29512);
}

TEST(LaunchKind, SingleNodeC10dNeedsALoopbackOrNoEndpoint) {
  auto none = classify({"--rdzv_backend=c10d"});
  EXPECT_EQ(none.kind, LaunchKind::kSingleNodeC10d);
  EXPECT_EQ(none.endpoint.host, "");
  EXPECT_FALSE(none.endpoint.port);
  for (const char* ep : {"localhost:0", "127.0.0.1:29400", "127.0.0.5", "[::1]:29400", "::1"}) {
    EXPECT_EQ(kind_of({"--rdzv_backend=c10d", std::string("--rdzv_endpoint=") + ep}),
              LaunchKind::kSingleNodeC10d)
        << ep;
  }
  auto v6 = classify({"--rdzv_backend=c10d", "--rdzv_endpoint=[::1]:7"});
  EXPECT_EQ(v6.endpoint.host, "::1");
  EXPECT_EQ(v6.endpoint.port, 7);
}

TEST(LaunchKind, MultiNode) {
  // c10d: a remote endpoint, even for one node, or more than one node.
  auto remote = classify({"--rdzv_backend=c10d", "--rdzv_endpoint=otherhost"});
  EXPECT_EQ(remote.kind, LaunchKind::kMultiNode);
  EXPECT_EQ(remote.endpoint.host, "otherhost");
  EXPECT_FALSE(remote.endpoint.port);
  EXPECT_EQ(kind_of({"--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1:1"}), LaunchKind::kMultiNode);
  EXPECT_EQ(kind_of({"--nnodes=1:2", "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:1"}),
            LaunchKind::kMultiNode);
  // static: --nnodes > 1.
  auto st = classify({"--nnodes=2", "--master_addr=node0"});
  EXPECT_EQ(st.kind, LaunchKind::kMultiNode);
  EXPECT_EQ(st.endpoint.host, "node0");
  EXPECT_FALSE(st.endpoint.port);  // the plan's default, 29500
}

TEST(LaunchKind, ValidationErrors) {
  EXPECT_NE(error_of({"--standalone", "--nnodes=2"}).find("--standalone runs one node"),
            std::string::npos);
  EXPECT_NE(
      error_of({"--rdzv_backend=etcd-v2"}).find("--rdzv-backend=etcd-v2 needs --rdzv-endpoint"),
      std::string::npos);
  EXPECT_NE(error_of({"--local_addr=a b"}).find("an address has no spaces"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes=2", "--rdzv_backend=c10d"}).find("needs --rdzv-endpoint"),
            std::string::npos);
  EXPECT_NE(error_of({"--nnodes=1:2"}).find("fixed number of nodes"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes=2", "--node_rank=5"}).find("expected 0 to 1"), std::string::npos);
  EXPECT_NE(error_of({"--node_rank=1"}).find("only node has rank 0"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes=2", "--master_port=0"}).find("fixed port"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes=2", "--rdzv_endpoint=h:0"}).find("fixed port"), std::string::npos);
  for (const char* ep : {"h", ":29500"}) {
    for (const char* nnodes : {"--nnodes=1", "--nnodes=2"}) {
      EXPECT_NE(error_of({nnodes, std::string("--rdzv_endpoint=") + ep}).find("needs HOST:PORT"),
                std::string::npos)
          << nnodes << " " << ep;
    }
  }
  EXPECT_NE(error_of({"--rdzv_backend=c10d", "--rdzv_endpoint=h:x"}).find("bad port"),
            std::string::npos);
}

TEST(LaunchKind, Endpoints) {
  auto a = parse_endpoint("[::1]:29400", "--x");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 29400);
  auto b = parse_endpoint("host", "--x");
  EXPECT_EQ(b.host, "host");
  EXPECT_FALSE(b.port);
  auto c = parse_endpoint("fe80::1", "--x");  // a bare IPv6 address has no port
  EXPECT_EQ(c.host, "fe80::1");
  EXPECT_FALSE(c.port);
  auto d = parse_endpoint("::", "--x");
  EXPECT_EQ(d.host, "::");
  EXPECT_FALSE(d.port);
  auto e = parse_endpoint("[fd00::2]", "--x");
  EXPECT_EQ(e.host, "fd00::2");
  EXPECT_FALSE(e.port);
  auto f = parse_endpoint("h:0", "--x");
  EXPECT_EQ(f.port, 0);
  EXPECT_EQ(parse_endpoint("", "--x").host, "");
  EXPECT_THROW(parse_endpoint("host:abc", "--x"), CliError);
  EXPECT_THROW(parse_endpoint("host:", "--x"), CliError);
  EXPECT_THROW(parse_endpoint("host:65536", "--x"), CliError);
  EXPECT_THROW(parse_endpoint("[::1]:", "--x"), CliError);
  EXPECT_THROW(parse_endpoint("[::1", "--x"), CliError);
  EXPECT_THROW(parse_endpoint("[::1]x", "--x"), CliError);
  // Not hosts, and what torchrun would read as another address and port.
  EXPECT_THROW(parse_endpoint("@@@:::x", "--x"), CliError);
  EXPECT_THROW(parse_endpoint("ho st:29400", "--x"), CliError);
  EXPECT_THROW(parse_endpoint("@@@", "--x"), CliError);
  try {
    parse_endpoint("::1:0", "--x");
    ADD_FAILURE() << "::1:0 accepted";
  } catch (const CliError& e) {
    EXPECT_NE(std::string(e.what()).find("write [::1]:0 for a port, or [::1:0] for the address"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(parse_endpoint("[::1:0]", "--x").host, "::1:0");
  EXPECT_EQ(parse_endpoint("node-1.cluster_a:29400", "--x").host, "node-1.cluster_a");
  EXPECT_NE(
      error_of({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=node0:0"}).find("fixed port"),
      std::string::npos);
}

TEST(BindHosts, LiteralsAsNamedElseTheWildcard) {
  EXPECT_EQ(bind_address("10.0.0.1", false), "10.0.0.1");
  EXPECT_EQ(bind_address("fd00::1", true), "fd00::1");
  EXPECT_EQ(bind_address("::1", true), "::1");
  EXPECT_EQ(bind_address("node0", false), "0.0.0.0");  // names are not resolved
  EXPECT_EQ(bind_address("node0", true), "::");
  EXPECT_EQ(bind_address("localhost", false), "0.0.0.0");
  EXPECT_EQ(bind_address("", false), "0.0.0.0");
  EXPECT_EQ(bind_address("0.0.0.0", false), "0.0.0.0");
  EXPECT_EQ(bind_address("::", true), "::");
  EXPECT_TRUE(is_ipv6_literal("fe80::1"));
  EXPECT_FALSE(is_ipv6_literal("10.0.0.1"));
  EXPECT_FALSE(is_ipv6_literal("host:1"));
  EXPECT_FALSE(is_ipv6_literal(""));
}

}  // namespace
}  // namespace ddprun::launcher
