#include "launcher/fanout/host_list.hpp"

#include <gtest/gtest.h>

#include "launcher/cli_parser.hpp"

namespace ddprun::launcher {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CliError& e) {
    return e.what();
  }
  return "";
}

TEST(Hostfile, SlotsCommentsAndBlankLines) {
  auto h =
      parse_hostfile("# the cluster\n\nnode1 slots=4\n  node2   slots=2  # small\nnode3\n", "hf");
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].name, "node1");
  EXPECT_EQ(h[0].slots, 4);
  EXPECT_EQ(h[1].name, "node2");
  EXPECT_EQ(h[1].slots, 2);
  EXPECT_EQ(h[2].name, "node3");
  EXPECT_FALSE(h[2].slots);
}

TEST(Hostfile, CrLfAndTabs) {
  auto h = parse_hostfile("a\tslots=1\r\nb slots=3\r\n", "hf");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[1].slots, 3);
}

TEST(Hostfile, Errors) {
  struct Case {
    const char* text;
    const char* message;
  } cases[] = {
      {"a slots=4\na slots=2\n", "hf:2: host a is listed twice"},
      {"a slots=x\n", "hf:1: expected 'HOST slots=N'"},
      {"a slots=0\n", "hf:1: expected 'HOST slots=N'"},
      {"a cpus=2\n", "hf:1: expected 'HOST slots=N'"},
      {"a slots=2 extra\n", "hf:1: expected 'HOST slots=N'"},
      {"-oProxyCommand=x slots=1\n", "cannot start with '-'"},
      {"# nothing\n\n", "hf: no hosts in the hostfile"},
  };
  for (const auto& c : cases) {
    std::string e = error_of([&] { parse_hostfile(c.text, "hf"); });
    EXPECT_NE(e.find(c.message), std::string::npos) << c.text << " -> " << e;
  }
}

TEST(HostList, OrderAndErrors) {
  auto h = parse_host_list("10.0.0.2,10.0.0.1, node3");
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].name, "10.0.0.2");
  EXPECT_EQ(h[2].name, "node3");
  EXPECT_NE(error_of([] { parse_host_list("a,,b"); }).find("empty host"), std::string::npos);
  EXPECT_NE(error_of([] { parse_host_list("a,a"); }).find("listed twice"), std::string::npos);
  EXPECT_NE(error_of([] { parse_host_list("a b"); }).find("bad host name"), std::string::npos);
}

std::vector<HostEntry> pool() {
  return {{"w0", 4}, {"w1", 4}, {"w2", 2}, {"bare", std::nullopt}};
}

std::string render(const std::vector<NodeSlots>& nodes) {
  std::string s;
  for (const auto& n : nodes) {
    if (!s.empty()) s += " ";
    s += n.host;
    if (n.devices) {
      s += ":";
      for (size_t i = 0; i < n.devices->size(); ++i)
        s += (i ? "," : "") + std::to_string((*n.devices)[i]);
    }
  }
  return s;
}

TEST(Filters, Table) {
  struct Case {
    const char* include;
    const char* exclude;
    const char* nodes;
  } cases[] = {
      {"", "", "w0 w1 w2 bare"},
      {"w1", "", "w1"},
      {"w2@w0", "", "w0 w2"},  // hostfile order, not the filter's
      {"w1:0,2", "", "w1:0,2"},
      {"w0@w1:3,1", "", "w0 w1:1,3"},
      {"w1:0@w1:2", "", "w1:0,2"},
      {"w1:0@w1", "", "w1"},  // the whole host wins
      {"bare:5", "", "bare:5"},
      {"", "w1", "w0 w2 bare"},
      {"", "w0:0", "w0:1,2,3 w1 w2 bare"},
      {"", "w2:0,1@bare", "w0 w1"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(render(apply_filters(pool(), c.include, c.exclude)), c.nodes)
        << "include=" << c.include << " exclude=" << c.exclude;
  }
}

TEST(Filters, Errors) {
  struct Case {
    const char* include;
    const char* exclude;
    const char* message;
  } cases[] = {
      {"w0", "w1", "cannot be used together"},
      {"nope", "", "--include: host 'nope' is not in the host list"},
      {"", "nope:1", "--exclude: host 'nope' is not in the host list"},
      {"w2:2", "", "host w2 has slots 0-1, not 2"},
      {"w0:x", "", "'x' is not a slot number"},
      {"w0:", "", "'' is not a slot number"},
      {":1", "", "expected HOST[:SLOT,...]"},
      {"", "bare:0", "has no slots=N"},
      {"", "w0@w1@w2@bare", "left no host"},
  };
  for (const auto& c : cases) {
    std::string e = error_of([&] { apply_filters(pool(), c.include, c.exclude); });
    EXPECT_NE(e.find(c.message), std::string::npos) << c.include << "/" << c.exclude << " -> " << e;
  }
}

}  // namespace
}  // namespace ddprun::launcher
