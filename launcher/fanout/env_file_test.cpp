#include "launcher/fanout/env_file.hpp"

#include <gtest/gtest.h>

#include <map>

namespace ddprun::launcher {
namespace {

TEST(EnvFile, Parse) {
  auto env = parse_env_file(
      "# comment\n\nNCCL_IB_DISABLE=1\nexport PYTHONPATH=/a:/b\nMSG=a b  'c' "
      "$d\nEMPTY=\nNCCL_IB_DISABLE=0\r\n",
      "f");
  ASSERT_EQ(env.size(), 4u);
  EXPECT_EQ(env[0], (std::pair<std::string, std::string>{"NCCL_IB_DISABLE", "0"}));
  EXPECT_EQ(env[1].second, "/a:/b");
  EXPECT_EQ(env[2].second, "a b  'c' $d");
  EXPECT_EQ(env[3].second, "");
}

TEST(EnvFile, BadLines) {
  EXPECT_THROW(parse_env_file("JUSTANAME\n", "f"), CliError);
  EXPECT_THROW(parse_env_file("1X=2\n", "f"), CliError);
  EXPECT_THROW(parse_env_file("A-B=2\n", "f"), CliError);
  try {
    parse_env_file("A=1\n=2\n", "/x/.ddprunenv");
    FAIL();
  } catch (const CliError& e) {
    EXPECT_NE(std::string(e.what()).find("/x/.ddprunenv:2:"), std::string::npos);
  }
}

struct Fake {
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> files;
  GetEnv getenv() {
    return [this](const std::string& n) -> std::optional<std::string> {
      auto it = env.find(n);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
  }
  ReadFile reader() {
    return [this](const std::string& p) -> std::optional<std::string> {
      auto it = files.find(p);
      if (it == files.end()) return std::nullopt;
      return it->second;
    };
  }
};

TEST(CollectExports, HomeThenCwdThenExport) {
  Fake f;
  f.env = {{"HOME", "/home/u"}, {"A", "from-env"}, {"B", "b env"}};
  f.files = {{"/home/u/.ddprunenv", "X=home\nY=home\n"}, {"/work/.ddprunenv", "Y=cwd\n"}};
  std::vector<std::string> notices;
  auto env = collect_exports({"A", "X=cli", "UNSET"}, f.getenv(), f.reader(), "/work", notices);
  EnvList want = {{"X", "cli"}, {"Y", "cwd"}, {"A", "from-env"}};
  EXPECT_EQ(env, want);
  ASSERT_EQ(notices.size(), 3u);
  EXPECT_NE(notices[2].find("UNSET is not set here"), std::string::npos);
}

TEST(CollectExports, DdprunEnvFileAlone) {
  Fake f;
  f.env = {{"HOME", "/home/u"}, {"DDPRUN_ENV_FILE", "/etc/job.env"}};
  f.files = {{"/home/u/.ddprunenv", "X=home\n"}, {"/etc/job.env", "Z=1\n"}};
  std::vector<std::string> notices;
  auto env = collect_exports({}, f.getenv(), f.reader(), "/work", notices);
  EXPECT_EQ(env, (EnvList{{"Z", "1"}}));
  f.env["DDPRUN_ENV_FILE"] = "/missing";
  EXPECT_THROW(collect_exports({}, f.getenv(), f.reader(), "/work", notices), CliError);
  EXPECT_THROW(collect_exports({"A-B"}, f.getenv(), f.reader(), "/work", notices), CliError);
}

}  // namespace
}  // namespace ddprun::launcher
