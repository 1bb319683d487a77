#include "launcher/hostlist.hpp"

#include <gtest/gtest.h>

namespace ddprun::launcher {
namespace {

using Hosts = std::vector<std::string>;

struct Case {
  const char* text;
  Hosts hosts;
};

TEST(Hostlist, ExpandsSlurmSyntax) {
  const Case cases[] = {
      {"node1", {"node1"}},
      {"a,b,c", {"a", "b", "c"}},
      {"n[1-3]", {"n1", "n2", "n3"}},
      {"n[8-11]", {"n8", "n9", "n10", "n11"}},
      {"n[01-03]", {"n01", "n02", "n03"}},
      {"n[001-010]",
       {"n001", "n002", "n003", "n004", "n005", "n006", "n007", "n008", "n009", "n010"}},
      {"n[098-101]", {"n098", "n099", "n100", "n101"}},
      {"n[1,3,5-7]", {"n1", "n3", "n5", "n6", "n7"}},
      {"n[7]", {"n7"}},
      {"n[3,1]", {"n3", "n1"}},  // Slurm keeps the written order
      {"rack[0-1]-n[01-02]", {"rack0-n01", "rack0-n02", "rack1-n01", "rack1-n02"}},
      {"r[1-2]c[3,5]s[0-1]",
       {"r1c3s0", "r1c3s1", "r1c5s0", "r1c5s1", "r2c3s0", "r2c3s1", "r2c5s0", "r2c5s1"}},
      {"[1-2]x", {"1x", "2x"}},
      {"gpu[01-02],cpu7,io[1,3]", {"gpu01", "gpu02", "cpu7", "io1", "io3"}},
      {"n1[0-2]", {"n10", "n11", "n12"}},
      {"127.0.0.[1-2]", {"127.0.0.1", "127.0.0.2"}},
      {"rack0-n01.cluster.local", {"rack0-n01.cluster.local"}},
  };
  for (const Case& c : cases) {
    Hostlist h = expand_hostlist(c.text);
    EXPECT_EQ(h.error, "") << c.text;
    EXPECT_EQ(h.hosts, c.hosts) << c.text;
  }
}

TEST(Hostlist, FullSixteenByFourProduct) {
  Hostlist h = expand_hostlist("rack[0-3]-n[01-16]");
  ASSERT_EQ(h.error, "");
  ASSERT_EQ(h.hosts.size(), 64u);
  EXPECT_EQ(h.hosts[0], "rack0-n01");
  EXPECT_EQ(h.hosts[15], "rack0-n16");
  EXPECT_EQ(h.hosts[16], "rack1-n01");
  EXPECT_EQ(h.hosts[63], "rack3-n16");
}

struct BadCase {
  const char* text;
  const char* error;  // a part of the message
};

TEST(Hostlist, RefusesBadInputWithAClearError) {
  const BadCase cases[] = {
      {"", "no host"},
      {"n[1-3", "unbalanced '['"},
      {"n1-3]", "unbalanced ']'"},
      {"n[1-3]]", "unbalanced ']'"},
      {"n[[1-3]]", "nested '['"},
      {"n[]", "empty brackets"},
      {"n[3-1]", "reversed range '3-1'"},
      {"n[a-c]", "'a-c' is not a number"},
      {"n[1-]", "'1-' is not a number"},
      {"n[-3]", "'-3' is not a number"},
      {"n[1-2-3]", "'1-2-3' is not a number"},
      {"n[1,,2]", "'' is not a number"},
      {"a,,b", "an empty entry"},
      {"a,", "an empty entry"},
      {"a b", "a space"},
      {"n[0-99999999]", "more than 65536 hosts"},
      {"n[0-999]x[0-999]", "more than 65536 hosts"},
      {"n[0-999999999999999999999]", "is not a number"},
  };
  for (const BadCase& c : cases) {
    Hostlist h = expand_hostlist(c.text);
    EXPECT_TRUE(h.hosts.empty()) << c.text;
    EXPECT_NE(h.error.find(c.error), std::string::npos) << c.text << " -> " << h.error;
    EXPECT_NE(h.error.find(std::string("'") + c.text + "'"), std::string::npos) << h.error;
  }
}

TEST(Hostlist, LimitCountsEveryEntry) {
  EXPECT_EQ(expand_hostlist("a[1-3],b[1-3]", 6).hosts.size(), 6u);
  EXPECT_NE(expand_hostlist("a[1-3],b[1-3]", 5).error, "");
  EXPECT_NE(expand_hostlist("a[1-3]b[1-2]", 5).error, "");
}

}  // namespace
}  // namespace ddprun::launcher
