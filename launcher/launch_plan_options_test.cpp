// make_launch_plan: which addresses the stores bind, the store proxy by job size, hang and
// health flags, and torchrun's documented usages (conformance).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agent/worker_env.hpp"
#include "launcher/launch_plan.hpp"
#include "launcher/launch_plan_test_util.hpp"

namespace ddprun::launcher {
namespace {

using test::LaunchPlanTest;

TEST_F(LaunchPlanTest, SingleNodeC10dBindsTheLoopbackItNames) {
  auto none = plan({"--rdzv_backend=c10d", "train"});
  EXPECT_EQ(none.kind, LaunchKind::kSingleNodeC10d);
  EXPECT_EQ(none.rendezvous.bind_host, "127.0.0.1");
  EXPECT_EQ(none.rendezvous.master_addr, "localhost");
  EXPECT_EQ(none.rendezvous.port, 29400);
  auto name = plan({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:29401", "train"});
  EXPECT_EQ(name.rendezvous.bind_host, "127.0.0.1");
  EXPECT_EQ(name.rendezvous.master_addr, "localhost");
  EXPECT_EQ(name.rendezvous.port, 29401);
  auto v4 = plan({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29402", "train"});
  EXPECT_EQ(v4.rendezvous.bind_host, "127.0.0.1");
  EXPECT_EQ(v4.rendezvous.master_addr, "127.0.0.1");
  auto other = plan({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.5:29403", "train"});
  EXPECT_EQ(other.rendezvous.bind_host, "127.0.0.5");  // where the workers connect
  EXPECT_EQ(other.rendezvous.master_addr, "127.0.0.5");
  auto v6 = plan({"--rdzv_backend=c10d", "--rdzv_endpoint=[::1]:29404", "train"});
  EXPECT_EQ(v6.kind, LaunchKind::kSingleNodeC10d);
  EXPECT_EQ(v6.rendezvous.bind_host, "::1");  // not "::", every interface
  EXPECT_EQ(v6.rendezvous.master_addr, "::1");
  EXPECT_EQ(v6.rendezvous.port, 29404);
}

TEST_F(LaunchPlanTest, SingleNodeStaticBindsALiteralElseTheWildcard) {
  auto dflt = plan({"--master_port=29511", "train"});  // --master-addr 127.0.0.1
  EXPECT_EQ(dflt.kind, LaunchKind::kSingleNodeStatic);
  EXPECT_EQ(dflt.rendezvous.bind_host, "127.0.0.1");
  EXPECT_EQ(dflt.rendezvous.master_addr, "127.0.0.1");
  auto v6 = plan({"--master_addr=::1", "--master_port=29511", "train"});
  EXPECT_EQ(v6.rendezvous.bind_host, "::1");
  EXPECT_EQ(v6.rendezvous.master_addr, "::1");
  auto name = plan({"--master_addr=node0", "--master_port=29511", "train"});
  EXPECT_EQ(name.rendezvous.bind_host, "0.0.0.0");  // a name is not resolved
  EXPECT_EQ(name.rendezvous.master_addr, "node0");
  auto any = plan({"--master_addr=::", "--master_port=29511", "train"});
  EXPECT_EQ(any.rendezvous.bind_host, "::");
  auto ep = plan({"--rdzv_endpoint=[fd00::7]:29512", "train"});
  EXPECT_EQ(ep.rendezvous.bind_host, "fd00::7");
  EXPECT_EQ(ep.rendezvous.master_addr, "fd00::7");
  EXPECT_EQ(ep.rendezvous.port, 29512);
  auto ep_name = plan({"--rdzv_endpoint=node0:29513", "train"});
  EXPECT_EQ(ep_name.rendezvous.bind_host, "0.0.0.0");
  EXPECT_EQ(ep_name.rendezvous.master_addr, "node0");
  auto free = plan({"--master_addr=10.1.2.3", "train"});  // no port: loopback, a free port
  EXPECT_EQ(free.rendezvous.bind_host, "127.0.0.1");
  EXPECT_EQ(free.rendezvous.master_addr, "localhost");
  EXPECT_EQ(free.rendezvous.port, 0);
}

// Multi-node: bind_host is where this agent hosts the rendezvous store (the endpoint),
// workers_bind_host where this node's workers' store listens (the advertised --local-addr).
TEST_F(LaunchPlanTest, MultiNodeBindsTheEndpointAndTheLocalAddr) {
  auto v4 = plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1:29400",
                  "--local_addr=10.0.0.2", "train"});
  EXPECT_EQ(v4.kind, LaunchKind::kMultiNode);
  EXPECT_EQ(v4.multi_node->bind_host, "10.0.0.1");
  EXPECT_EQ(v4.multi_node->workers_bind_host, "10.0.0.2");
  auto names = plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=storehost",
                     "--local_addr=node1", "train"});
  EXPECT_EQ(names.multi_node->bind_host, "0.0.0.0");
  EXPECT_EQ(names.multi_node->workers_bind_host, "0.0.0.0");
  auto no_local = plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=storehost", "train"});
  EXPECT_EQ(no_local.multi_node->workers_bind_host, "0.0.0.0");
  auto v6_local = plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=storehost",
                        "--local_addr=fd00::2", "train"});
  EXPECT_EQ(v6_local.multi_node->bind_host, "::");  // a name, on an IPv6 network
  EXPECT_EQ(v6_local.multi_node->workers_bind_host, "fd00::2");
  auto v6_ep = plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=[fd00::1]:29400",
                     "--local_addr=node1", "train"});
  EXPECT_EQ(v6_ep.multi_node->bind_host, "fd00::1");
  EXPECT_EQ(v6_ep.multi_node->workers_bind_host, "::");
  auto any = plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=0.0.0.0:29400", "train"});
  EXPECT_EQ(any.multi_node->bind_host, "0.0.0.0");
  // Static: node 0 hosts the store at --master-addr:--master-port, by the same rule.
  auto st = plan({"--nnodes=2", "--master_addr=10.0.0.1", "--master_port=29511",
                  "--local_addr=10.0.0.1", "train"});
  EXPECT_EQ(st.multi_node->bind_host, "10.0.0.1");
  EXPECT_EQ(st.multi_node->workers_bind_host, "10.0.0.1");
  auto st_name = plan({"--nnodes=2", "--master_addr=node0", "train"});
  EXPECT_EQ(st_name.multi_node->bind_host, "0.0.0.0");
  EXPECT_EQ(st_name.multi_node->workers_bind_host, "0.0.0.0");
  auto st_v6 = plan({"--nnodes=2", "--rdzv_endpoint=[fd00::1]:29511", "train"});
  EXPECT_EQ(st_v6.multi_node->endpoint_host, "fd00::1");
  EXPECT_EQ(st_v6.multi_node->endpoint_port, 29511);
  EXPECT_EQ(st_v6.multi_node->bind_host, "fd00::1");
  EXPECT_EQ(st_v6.multi_node->workers_bind_host, "::");
}

// --store-proxy auto is on from 32 nodes (the MAX of --nnodes); on/off force it; one node's
// workers always use the agent's store directly.
TEST_F(LaunchPlanTest, StoreProxyByJobSize) {
  auto proxied = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1:29400"});
    args.push_back("train");
    return plan(args).multi_node->store_proxy;
  };
  EXPECT_FALSE(proxied({"--nnodes=2"}));
  EXPECT_FALSE(proxied({"--nnodes=2:31"}));
  EXPECT_TRUE(proxied({"--nnodes=2:32"}));
  EXPECT_TRUE(proxied({"--nnodes=64"}));
  EXPECT_TRUE(proxied({"--nnodes=2", "--store-proxy=on"}));
  EXPECT_FALSE(proxied({"--nnodes=64", "--store-proxy", "off"}));
  const LaunchPlan one = plan({"--standalone", "--store-proxy=on", "train"});
  EXPECT_FALSE(one.multi_node);
  EXPECT_NE(std::find_if(one.notices.begin(), one.notices.end(),
                         [](const std::string& n) { return n.find("--store-proxy") == 0; }),
            one.notices.end());
  EXPECT_THROW(plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h:1",
                     "--store-proxy=sometimes", "train"}),
               CliError);
}

TEST_F(LaunchPlanTest, LogDirThatIsAFile) {
  EXPECT_NE(error_of({"--log_dir", (dir_ / "script.py").string(), "train"}).find("is a file"),
            std::string::npos);
}

TEST_F(LaunchPlanTest, HangAndHealthFlags) {
  const std::string script = (dir_ / "script.py").string();
  auto p = plan({"--hang-timeout=2.5", "--hang_start_timeout", "30", "--exit-timeout=0",
                 "--health-port=0", "--event-log", "/tmp/ev.jsonl", script});
  EXPECT_EQ(p.spec.hang_timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(p.spec.hang_start_timeout, std::chrono::seconds(30));
  EXPECT_EQ(p.spec.exit_timeout, std::chrono::milliseconds(0));
  EXPECT_EQ(p.spec.health_port, 0);
  EXPECT_EQ(p.spec.health_host, "127.0.0.1");
  EXPECT_EQ(p.spec.event_log, "/tmp/ev.jsonl");
  EXPECT_FALSE(p.spec.file_timer);

  auto defaults = plan({script});
  EXPECT_EQ(defaults.spec.hang_timeout, std::chrono::milliseconds(0));
  EXPECT_EQ(defaults.spec.exit_timeout, std::chrono::seconds(300));
  EXPECT_FALSE(defaults.spec.health_port);
}

TEST_F(LaunchPlanTest, TorchrunsWatchdogAndHealthVariables) {
  vars_["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1";
  vars_["TORCHELASTIC_TIMER_FILE"] = "/tmp/my_timer";
  vars_["TORCHELASTIC_HEALTH_CHECK_PORT"] = "8123";
  auto p = plan({(dir_ / "script.py").string()});
  EXPECT_TRUE(p.spec.file_timer);
  EXPECT_EQ(p.spec.timer_file, "/tmp/my_timer");
  EXPECT_EQ(p.spec.health_port, 8123);
  // The flag wins over the variable.
  EXPECT_EQ(plan({"--health-port=9000", (dir_ / "script.py").string()}).spec.health_port, 9000);
  vars_["TORCHELASTIC_HEALTH_CHECK_PORT"] = "http";
  EXPECT_NE(error_of({(dir_ / "script.py").string()}).find("TORCHELASTIC_HEALTH_CHECK_PORT"),
            std::string::npos);
}

TEST_F(LaunchPlanTest, BadHangAndHealthValuesAreOneLine) {
  const std::string script = (dir_ / "script.py").string();
  EXPECT_NE(error_of({"--hang-timeout=-1", script}).find("expected a number of seconds"),
            std::string::npos);
  EXPECT_NE(error_of({"--exit-timeout=soon", script}).find("--exit-timeout=soon"),
            std::string::npos);
  EXPECT_NE(error_of({"--health-port=70000", script}).find("a port is a number"),
            std::string::npos);
  EXPECT_NE(error_of({"--health-host=localhost", script}).find("--health-host=localhost"),
            std::string::npos);
}

bool has_notice(const LaunchPlan& p, const std::string& text) {
  for (const auto& n : p.notices) {
    if (n.find(text) != std::string::npos) return true;
  }
  return false;
}

// torchrun 2.15's documented usages, run as ddprun (launcher/README.md, "Differences").
TEST_F(LaunchPlanTest, TorchrunConformance) {
  // --run-path: the script runs in a python3 -u of its own, whatever its name.
  auto run_path = plan({"--run-path", (dir_ / "notexec").string(), "a"});
  EXPECT_EQ(run_path.spec.program, (dir_ / "bin" / "python3").string());
  EXPECT_EQ(run_path.spec.args, (std::vector<std::string>{"-u", (dir_ / "notexec").string(), "a"}));
  // --logs-specs: torch's default layout is ddprun's; a plugin is not.
  EXPECT_EQ(plan({"--logs-specs", "default", "train"}).spec.program,
            (dir_ / "bin" / "train").string());
  EXPECT_NE(error_of({"--logs-specs=mine", "train"})
                .find("--logs-specs=mine: --logs-specs loads a "
                      "Python plugin"),
            std::string::npos);
  // --rdzv-conf keys are read where torchrun reads them: c10d ignores `timeout`, and a quoted
  // value (as some scripts pass it) is no error, only notices.
  auto quoted = plan({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h", "--rdzv-id=j",
                      "--rdzv-conf", "'join_timeout=5,last_call_timeout=1,timeout=5'", "train"});
  ASSERT_TRUE(quoted.multi_node);
  EXPECT_EQ(quoted.multi_node->last_call_timeout, std::chrono::seconds(1));
  EXPECT_EQ(quoted.multi_node->join_timeout, std::chrono::seconds(600));
  EXPECT_TRUE(has_notice(quoted, "ignoring unknown key ''join_timeout'"));
  EXPECT_TRUE(has_notice(quoted, "--rdzv-conf timeout: not read by the c10d backend"));
  auto c10d = plan({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h", "--rdzv-id=j",
                    "--rdzv-conf=timeout=x,join_timeout=7", "train"});
  EXPECT_EQ(c10d.multi_node->join_timeout, std::chrono::seconds(7));
  // The static backend reads `timeout`, not join_timeout.
  auto st = plan({"--nnodes=2", "--master-addr=h", "--master-port=29500",
                  "--rdzv-conf=timeout=9,join_timeout=x", "train"});
  EXPECT_EQ(st.multi_node->join_timeout, std::chrono::seconds(9));
  EXPECT_EQ(st.multi_node->join_timeout_key, "timeout");
  EXPECT_TRUE(has_notice(st, "join_timeout: not read by the static backend"));
  EXPECT_NE(error_of({"--nnodes=2", "--master-addr=h", "--master-port=29500",
                      "--rdzv-conf=timeout=abc", "train"})
                .find("--rdzv-conf timeout=abc: expected a number of seconds"),
            std::string::npos);
  // One node refuses what several would.
  EXPECT_NE(error_of({"--rdzv-backend=c10d", "--rdzv-conf=join_timeout=abc", "train"})
                .find("--rdzv-conf join_timeout=abc"),
            std::string::npos);
  // --nproc-per-node=xpu: refused with a word.
  EXPECT_NE(error_of({"--nproc-per-node=xpu", "train"}).find("Intel XPUs are not supported"),
            std::string::npos);
}

// torchrun's own variables stand in for their flags, through the flag table.
TEST_F(LaunchPlanTest, TorchrunVariablesAreFlagSources) {
  vars_["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "7";
  vars_["TORCHELASTIC_HEALTH_CHECK_PORT"] = "0";
  vars_["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[${rank}]";
  auto p = plan({"train"});
  EXPECT_EQ(p.spec.shutdown_timeout, std::chrono::seconds(7));
  EXPECT_EQ(p.spec.health_port, 0);
  EXPECT_EQ(p.spec.log_line_prefix_template, "[${rank}]");
  EXPECT_EQ(plan({"--shutdown-timeout=3", "train"}).spec.shutdown_timeout, std::chrono::seconds(3));
  vars_["PET_SHUTDOWN_TIMEOUT"] = "4";  // PET_ before torchrun's variable
  EXPECT_EQ(plan({"train"}).spec.shutdown_timeout, std::chrono::seconds(4));
  vars_["TORCHELASTIC_HEALTH_CHECK_PORT"] = "abc";
  EXPECT_NE(error_of({"train"}).find("TORCHELASTIC_HEALTH_CHECK_PORT=abc: not an integer"),
            std::string::npos);
}

}  // namespace
}  // namespace ddprun::launcher
