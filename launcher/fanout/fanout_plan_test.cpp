#include "launcher/fanout/fanout_plan.hpp"

#include <gtest/gtest.h>

#include <map>

#include "launcher/fanout/shell_words.hpp"

namespace ddprun::launcher {
namespace {

struct Machine {
  std::map<std::string, std::string> env = {{"HOME", "/home/u"}};
  std::map<std::string, std::string> files;

  GetEnv getenv() const {
    return [this](const std::string& n) -> std::optional<std::string> {
      auto it = env.find(n);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
  }
  FanoutInputs inputs() const {
    FanoutInputs in;
    in.getenv = getenv();
    in.read_file = [this](const std::string& p) -> std::optional<std::string> {
      auto it = files.find(p);
      if (it == files.end()) return std::nullopt;
      return it->second;
    };
    in.cwd = "/work/my job";
    in.self_exe = "/opt/ddprun/bin/ddprun";
    return in;
  }
  FanoutPlan plan(const std::vector<std::string>& args) const {
    return make_fanout_plan(parse_command_line(args, getenv()), inputs());
  }
};

// The remote command's words after "exec", as the remote shell will split them.
std::vector<std::string> remote_words(const RemoteNode& n) {
  const std::string& cmd = n.remote_command;
  size_t exec = cmd.find(" && exec ");
  return split_shell_words(cmd.substr(exec + 9), "t");
}

TEST(FanoutPlan, StaticJobOnTwoHosts) {
  Machine m;
  auto plan = m.plan({"--hosts=10.0.0.1,10.0.0.2", "--nproc-per-node=2", "--max-restarts=1",
                      "--ssh-options", "-i '/k/id rsa' -o CheckHostIP=no", "--ssh-port=2222",
                      "train.py", "--msg", "it's $HOME", "${local_rank}"});
  ASSERT_EQ(plan.nodes.size(), 2u);
  const RemoteNode& n1 = plan.nodes[1];
  EXPECT_EQ(n1.host, "10.0.0.2");
  EXPECT_EQ(n1.node_rank, 1);
  EXPECT_EQ(n1.remote_command.substr(0, 23), "cd '/work/my job' && ex");
  std::vector<std::string> want = {"env",
                                   "/opt/ddprun/bin/ddprun",
                                   "--stop-on-stdin-eof",
                                   "--max-restarts=1",
                                   "--nnodes=2",
                                   "--node-rank=1",
                                   "--local-addr=10.0.0.2",
                                   "--master-addr=10.0.0.1",
                                   "--master-port=29500",
                                   "--nproc-per-node=2",
                                   "--",
                                   "train.py",
                                   "--msg",
                                   "it's $HOME",
                                   "${local_rank}"};
  EXPECT_EQ(remote_words(n1), want);
  std::vector<std::string> ssh = {"ssh",
                                  "-i",
                                  "/k/id rsa",
                                  "-o",
                                  "CheckHostIP=no",
                                  "-o",
                                  "BatchMode=yes",
                                  "-o",
                                  "ConnectTimeout=10",
                                  "-o",
                                  "ServerAliveInterval=5",
                                  "-o",
                                  "ServerAliveCountMax=6",
                                  "-p",
                                  "2222",
                                  "--",
                                  "10.0.0.2",
                                  n1.remote_command};
  EXPECT_EQ(n1.ssh_argv, ssh);
  EXPECT_EQ(n1.probe_argv[n1.probe_argv.size() - 4], "-n");
  EXPECT_EQ(n1.probe_argv.back(),
            "cd '/work/my job' || exit 3; test -x /opt/ddprun/bin/ddprun || exit 4");
}

TEST(FanoutPlan, HostfileSlotsAndFilters) {
  Machine m;
  m.files["hosts"] = "# two kinds\na slots=4\nb slots=2\nc slots=8\n";
  auto plan = m.plan({"--hostfile", "hosts", "--exclude", "c@a:1", "-m", "pkg.main"});
  ASSERT_EQ(plan.nodes.size(), 2u);
  auto a = remote_words(plan.nodes[0]);
  auto b = remote_words(plan.nodes[1]);
  EXPECT_EQ(a[1], "CUDA_VISIBLE_DEVICES=0,2,3");
  EXPECT_NE(std::find(a.begin(), a.end(), "--nproc-per-node=3"), a.end());
  EXPECT_NE(std::find(a.begin(), a.end(), "--module"), a.end());
  EXPECT_EQ(b[1], "/opt/ddprun/bin/ddprun");  // no devices named: CUDA_VISIBLE_DEVICES untouched
  EXPECT_NE(std::find(b.begin(), b.end(), "--nproc-per-node=2"), b.end());  // its slots
  EXPECT_EQ(b.back(), "pkg.main");
}

TEST(FanoutPlan, ExportsAndEnvFiles) {
  Machine m;
  m.env["GLOO_SOCKET_IFNAME"] = "eth0";
  m.files["/home/u/.ddprunenv"] = "A=home\n";
  m.files["/work/my job/.ddprunenv"] = "A=cwd\nB=x y\n";
  auto plan = m.plan({"--hosts=h1,h2", "--export=GLOO_SOCKET_IFNAME,C=3", "x.py"});
  auto w = remote_words(plan.nodes[0]);
  std::vector<std::string> head(w.begin(), w.begin() + 5);
  EXPECT_EQ(head,
            (std::vector<std::string>{"env", "A=cwd", "B=x y", "GLOO_SOCKET_IFNAME=eth0", "C=3"}));
}

TEST(FanoutPlan, ForwardsPetValuesAndFirstNHosts) {
  Machine m;
  m.env["PET_MAX_RESTARTS"] = "2";
  auto plan = m.plan(
      {"--hosts=h1,h2,h3", "--nnodes=2", "--master-addr=10.9.9.9", "--master-port=4000", "x.py"});
  ASSERT_EQ(plan.nodes.size(), 2u);
  auto w = remote_words(plan.nodes[1]);
  for (const char* flag : {"--max-restarts=2", "--nnodes=2", "--master-addr=10.9.9.9",
                           "--master-port=4000", "--local-addr=h2"}) {
    EXPECT_NE(std::find(w.begin(), w.end(), flag), w.end()) << flag;
  }
}

TEST(FanoutPlan, C10dEndpointDefaultsToTheFirstHost) {
  Machine m;
  auto plan = m.plan({"--hosts=h1,h2", "--rdzv-backend=c10d", "--rdzv-id=j", "x.py"});
  auto w = remote_words(plan.nodes[1]);
  EXPECT_NE(std::find(w.begin(), w.end(), "--rdzv-endpoint=h1:29400"), w.end());
  EXPECT_NE(std::find(w.begin(), w.end(), "--rdzv-backend=c10d"), w.end());
  EXPECT_EQ(std::find(w.begin(), w.end(), "--master-addr=h1"), w.end());
}

TEST(FanoutPlan, BadCombinations) {
  Machine m;
  m.files["hosts"] = "a slots=2\nb slots=2\n";
  struct Case {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"--hosts=a", "--hostfile=hosts", "x.py"}, "cannot be used together"},
      {{"--hostfile=missing", "x.py"}, "--hostfile=missing: no such file"},
      {{"--hosts=a,b", "--node-rank=1", "x.py"}, "--node-rank cannot be used with --hosts"},
      {{"--hosts=a,b", "--local-addr=x", "x.py"}, "--local-addr cannot be used"},
      {{"--hosts=a,b", "--standalone", "x.py"}, "--standalone cannot be used"},
      {{"--hosts=a,b", "--nnodes=3", "x.py"}, "only 2 host(s)"},
      {{"--hosts=a,b", "--nnodes=1:2", "x.py"}, "how many of the hosts"},
      {{"--hostfile=hosts", "--include=a", "--nnodes=1", "x.py"}, "--nnodes cannot be combined"},
      {{"--hostfile=hosts", "--include=a:1", "--nproc-per-node=2", "x.py"},
       "--nproc-per-node cannot be combined"},
      {{"--hostfile=hosts", "--include=a:1@b:0,,", "x.py"}, "not a slot number"},
      {{"--hosts=a", "--ssh-options=-i 'k", "x.py"}, "unterminated"},
  };
  for (const auto& c : cases) {
    std::string e;
    try {
      m.plan(c.args);
    } catch (const CliError& err) {
      e = err.what();
    }
    EXPECT_NE(e.find(c.message), std::string::npos) << c.args[1] << " -> " << e;
  }
}

TEST(FanoutPlan, FanoutFlagsNeedHosts) {
  Machine m;
  for (const char* flag : {"--include=a", "--export=A", "--ssh-port=22", "--remote-ddprun=/x"}) {
    EXPECT_THROW(parse_command_line({flag, "x.py"}, m.getenv()), CliError) << flag;
  }
  EXPECT_THROW(parse_command_line({"--hosts=a", "--ssh-port=0", "x.py"}, m.getenv()), CliError);
  EXPECT_THROW(parse_command_line({"--hosts=a", "--remote-ddprun=rel", "x.py"}, m.getenv()),
               CliError);
  EXPECT_TRUE(
      parse_command_line({"--stop-on-stdin-eof", "x.py"}, m.getenv()).fanout.stop_on_stdin_eof);
}

}  // namespace
}  // namespace ddprun::launcher

namespace ddprun::launcher {
namespace {

// The fan-out reads the same resolved flags as the local plan: torchrun's grace variable is
// the nodes' grace, sent to them as a flag (they get sshd's environment, not ours), and a bad
// close_timeout is refused here as the nodes would refuse it.
TEST(FanoutPlan, FlagsFromTheEnvironmentReachTheNodes) {
  Machine m;
  m.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "12";
  auto plan = m.plan({"--hosts=a,b", "--rdzv-conf=close_timeout=4", "train"});
  EXPECT_EQ(plan.shutdown_timeout, std::chrono::seconds(12));
  EXPECT_EQ(plan.close_timeout, std::chrono::seconds(4));
  auto words = remote_words(plan.nodes[1]);
  EXPECT_NE(std::find(words.begin(), words.end(), "--shutdown-timeout=12"), words.end());
  EXPECT_THROW(m.plan({"--hosts=a,b", "--rdzv-conf=close_timeout=x", "train"}), CliError);
}

}  // namespace
}  // namespace ddprun::launcher
