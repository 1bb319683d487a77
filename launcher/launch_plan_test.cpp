#include "launcher/launch_plan.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "agent/worker_env.hpp"
#include "launcher/devices.hpp"
#include "launcher/entrypoint.hpp"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;

class LaunchPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ddprun_plan_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "bin");
    write(dir_ / "bin" / "python3", "#!/bin/sh\n", 0755);
    write(dir_ / "bin" / "train", "#!/bin/sh\n", 0755);
    write(dir_ / "script.py", "print(1)\n", 0644);
    write(dir_ / "notexec", "x\n", 0644);
    vars_["PATH"] = (dir_ / "bin").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void write(const fs::path& p, const std::string& text, mode_t mode) {
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
  }
  GetEnv env() const {
    return [this](const std::string& n) -> std::optional<std::string> {
      auto it = vars_.find(n);
      if (it == vars_.end()) return std::nullopt;
      return it->second;
    };
  }
  LaunchPlan plan(std::vector<std::string> args) {
    return make_launch_plan(parse_command_line(args, env()), env(), {"PATH=" + vars_["PATH"]});
  }
  std::string error_of(std::vector<std::string> args) {
    try {
      plan(std::move(args));
    } catch (const CliError& e) {
      return e.what();
    }
    return "<no error>";
  }

  fs::path dir_;
  std::map<std::string, std::string> vars_;
};

TEST_F(LaunchPlanTest, PythonScript) {
  auto p = plan({"--nproc_per_node=2", (dir_ / "script.py").string(), "--lr", "0.1"});
  EXPECT_EQ(p.spec.program, (dir_ / "bin" / "python3").string());
  EXPECT_EQ(p.spec.argv0, "python3");
  EXPECT_EQ(p.spec.args,
            (std::vector<std::string>{"-u", (dir_ / "script.py").string(), "--lr", "0.1"}));
  EXPECT_EQ(p.spec.entrypoint_name, (dir_ / "script.py").string());
  EXPECT_EQ(p.spec.local_world_size, 2);
  EXPECT_EQ(agent::find_env(p.spec.base_env, "OMP_NUM_THREADS"), "1");
  EXPECT_FALSE(p.notices.empty());
}

TEST_F(LaunchPlanTest, PythonExecAndModule) {
  vars_["PYTHON_EXEC"] = (dir_ / "bin" / "train").string();
  auto p = plan({"-m", "pkg.main", "a"});
  EXPECT_EQ(p.spec.program, (dir_ / "bin" / "train").string());
  EXPECT_EQ(p.spec.args, (std::vector<std::string>{"-u", "-m", "pkg.main", "a"}));
  EXPECT_EQ(p.spec.entrypoint_name, "pkg.main");
  EXPECT_FALSE(agent::find_env(p.spec.base_env, "OMP_NUM_THREADS"));  // one worker
}

TEST_F(LaunchPlanTest, ExecutablesAreExecdDirectly) {
  auto p = plan({"train", "--steps", "3"});
  EXPECT_EQ(p.spec.program, (dir_ / "bin" / "train").string());
  EXPECT_EQ(p.spec.argv0, "train");
  EXPECT_EQ(p.spec.args, (std::vector<std::string>{"--steps", "3"}));
  auto q = plan({"--no_python", (dir_ / "bin" / "train").string()});
  EXPECT_EQ(q.spec.program, (dir_ / "bin" / "train").string());
}

TEST_F(LaunchPlanTest, MissingOrNonExecutableEntrypoints) {
  EXPECT_NE(error_of({"nosuchprogram"}).find("not found on PATH"), std::string::npos);
  EXPECT_NE(error_of({(dir_ / "missing.py").string()}).find("does not exist"), std::string::npos);
  EXPECT_NE(error_of({(dir_ / "notexec").string()}).find("not executable"), std::string::npos);
  EXPECT_NE(error_of({"--no_python", (dir_ / "script.py").string()}).find("not executable"),
            std::string::npos);
  vars_["PYTHON_EXEC"] = "/nonexistent/python";
  EXPECT_NE(error_of({(dir_ / "script.py").string()}).find("PYTHON_EXEC"), std::string::npos);
}

TEST_F(LaunchPlanTest, RendezvousChoices) {
  auto standalone = plan({"--standalone", "train"});
  EXPECT_EQ(standalone.rendezvous.port, 0);
  EXPECT_EQ(standalone.rendezvous.master_addr, "localhost");
  EXPECT_EQ(standalone.rendezvous.bind_host, "127.0.0.1");
  EXPECT_EQ(standalone.rendezvous.run_id.size(), 36u);
  auto dflt = plan({"train"});
  EXPECT_EQ(dflt.rendezvous.port, 0);  // torchrun 2.x: no port given on one node
  auto fixed = plan({"--master_addr=10.1.2.3", "--master_port=29511", "train"});
  EXPECT_EQ(fixed.rendezvous.port, 29511);
  EXPECT_EQ(fixed.rendezvous.master_addr, "10.1.2.3");
  EXPECT_EQ(fixed.rendezvous.bind_host, "10.1.2.3");  // the address named, not every interface
  EXPECT_EQ(fixed.rendezvous.run_id, "none");
  auto c10d = plan({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--rdzv_id=j", "train"});
  EXPECT_EQ(c10d.rendezvous.port, 0);
  EXPECT_EQ(c10d.rendezvous.run_id, "j");
  // The restart budget is the rendezvous's, on every single-node kind.
  EXPECT_EQ(plan({"--max_restarts=2", "train"}).rendezvous.max_restarts, 2);
  EXPECT_EQ(plan({"--standalone", "--max_restarts=3", "train"}).rendezvous.max_restarts, 3);
  EXPECT_EQ(plan({"--rdzv_backend=c10d", "--max_restarts=4", "train"}).rendezvous.max_restarts, 4);
}

TEST_F(LaunchPlanTest, StaticMultiNode) {
  auto p = plan({"--nnodes=3", "--node_rank=2", "--master_addr=10.0.0.1", "--master_port=29511",
                 "--local_addr=10.0.0.3", "train"});
  ASSERT_TRUE(p.multi_node);
  const auto& s = *p.multi_node;
  EXPECT_EQ(s.backend, agent::Backend::kStatic);
  EXPECT_EQ(s.min_nodes, 3);
  EXPECT_EQ(s.max_nodes, 3);
  EXPECT_TRUE(s.static_ranks);
  EXPECT_EQ(s.node_rank_hint, 2);
  EXPECT_EQ(s.is_host, std::optional<bool>(false));
  EXPECT_EQ(s.endpoint_host, "10.0.0.1");
  EXPECT_EQ(s.endpoint_port, 29511);
  EXPECT_EQ(s.local_addr, "10.0.0.3");
  auto host = plan({"--nnodes=2", "--master_addr=h", "train"});
  EXPECT_EQ(host.multi_node->is_host, std::optional<bool>(true));  // node 0 hosts
  EXPECT_EQ(host.multi_node->endpoint_port, 29500);                // torchrun's default
  EXPECT_NE(error_of({"--nnodes=2:3", "train"}).find("fixed number of nodes"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes=2", "--node_rank=2", "train"}).find("expected 0 to 1"),
            std::string::npos);
  EXPECT_NE(error_of({"--node_rank=1", "train"}).find("only node has rank 0"), std::string::npos);
}

TEST_F(LaunchPlanTest, ElasticC10d) {
  auto p = plan({"--nnodes=2:4", "--rdzv_backend=c10d", "--rdzv_endpoint=[fe80::1]:1234",
                 "--rdzv_id=job7", "--max_restarts=3",
                 "--rdzv_conf=join_timeout=2.5,last_call_timeout=0,is_host=0,keep_alive_interval=1",
                 "train"});
  ASSERT_TRUE(p.multi_node);
  const auto& s = *p.multi_node;
  EXPECT_EQ(s.backend, agent::Backend::kC10d);
  EXPECT_EQ(s.min_nodes, 2);
  EXPECT_EQ(s.max_nodes, 4);
  EXPECT_FALSE(s.static_ranks);
  EXPECT_EQ(s.node_rank_hint, -1);  // not given
  EXPECT_EQ(s.endpoint_host, "fe80::1");
  EXPECT_EQ(s.endpoint_port, 1234);
  EXPECT_EQ(s.bind_host, "fe80::1");
  EXPECT_EQ(s.workers_bind_host, "::");  // no --local-addr: the IPv6 wildcard
  EXPECT_EQ(s.run_id, "job7");
  EXPECT_EQ(s.max_restarts, 3);
  EXPECT_EQ(s.join_timeout.count(), 2500);
  EXPECT_EQ(s.last_call_timeout.count(), 0);
  EXPECT_EQ(s.keep_alive_interval.count(), 1000);
  EXPECT_EQ(s.is_host, std::optional<bool>(false));
  auto dflt = plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h", "train"});
  EXPECT_EQ(dflt.multi_node->endpoint_port, 29400);
  EXPECT_FALSE(dflt.multi_node->is_host);  // torchrun's rule, decided at run time
  bool warned = false;
  for (const auto& n : dflt.notices) warned |= n.find("--rdzv-id is 'none'") != std::string::npos;
  EXPECT_TRUE(warned);
  // One node with a remote endpoint joins that store too.
  EXPECT_TRUE(plan({"--rdzv_backend=c10d", "--rdzv_endpoint=otherhost:29400", "train"}).multi_node);
  // One node with a local endpoint keeps the single-node rendezvous.
  EXPECT_FALSE(plan({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "train"}).multi_node);
}

TEST_F(LaunchPlanTest, Etcd) {
  for (const char* backend : {"etcd", "etcd-v2", "etcd-v3"}) {
    auto p = plan({"--nnodes=1:3", std::string("--rdzv_backend=") + backend,
                   "--rdzv_endpoint=e1,e2:2380", "--rdzv_id=j", "--node_rank=2",
                   "--rdzv_conf=keep_alive_interval=0.5", "train"});
    ASSERT_TRUE(p.multi_node) << backend;  // one node too: etcd holds the job
    const auto& s = *p.multi_node;
    EXPECT_EQ(s.backend, agent::Backend::kEtcd);
    ASSERT_EQ(s.etcd_members.size(), 2u);
    EXPECT_EQ(s.etcd_members[1].host, "e2");
    EXPECT_EQ(s.etcd_members[1].port, 2380);
    EXPECT_EQ(s.is_host, std::optional<bool>(false));
    EXPECT_EQ(s.node_rank_hint, 2);
    EXPECT_FALSE(s.etcd_tls);
    bool noticed = false;
    for (const auto& n : p.notices) noticed |= n.find("v3 API") != std::string::npos;
    EXPECT_EQ(noticed, std::string(backend) == "etcd-v2") << backend;
  }
  // torchrun's etcd-v2 spellings of the TLS files; certificates mean TLS.
  const std::string file = "/proc/self/exe";  // any readable file
  auto tls = plan({"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=e",
                   "--rdzv_conf=ca_cert=" + file + ",ssl_cert=" + file + ",ssl_cert_key=" + file,
                   "train"});
  EXPECT_TRUE(tls.multi_node->etcd_tls);
  EXPECT_EQ(tls.multi_node->etcd_cacert, file);
  EXPECT_EQ(tls.multi_node->etcd_key, file);
  EXPECT_NE(error_of({"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=e",
                      "--rdzv_conf=cert=" + file, "train"})
                .find("together"),
            std::string::npos);
}

TEST_F(LaunchPlanTest, BadMultiNodeInput) {
  EXPECT_NE(error_of({"--nnodes=2", "--rdzv_backend=c10d", "train"}).find("needs --rdzv-endpoint"),
            std::string::npos);
  EXPECT_NE(error_of({"--rdzv_backend=etcd", "train"}).find("needs --rdzv-endpoint"),
            std::string::npos);
  EXPECT_NE(error_of({"--rdzv_backend=etcd", "--rdzv_endpoint=h:99999", "train"})
                .find("the port must be 1 to 65535"),
            std::string::npos);
  EXPECT_NE(
      error_of({"--rdzv_backend=etcd", "--rdzv_endpoint=h", "--rdzv_conf=ssl_cert=/x", "train"})
          .find("ssl_cert=/x"),
      std::string::npos);
  EXPECT_NE(error_of({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h",
                      "--rdzv_conf=join_timeout=-1", "train"})
                .find("join_timeout=-1"),
            std::string::npos);
  // One node refuses what several would (it used to ignore --rdzv-conf under --standalone).
  EXPECT_NE(
      error_of({"--standalone", "--rdzv_conf=join_timeout=abc", "train"}).find("join_timeout=abc"),
      std::string::npos);
  EXPECT_NE(error_of({"--rdzv_conf=join_timeout=abc", "train"}).find("join_timeout=abc"),
            std::string::npos);
  EXPECT_NE(error_of({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h",
                      "--rdzv_conf=is_host=maybe", "train"})
                .find("expected true or false"),
            std::string::npos);
  EXPECT_NE(error_of({"--nnodes=2", "--master_port=0", "train"}).find("fixed port"),
            std::string::npos);
  EXPECT_NE(error_of({"--standalone", "--nnodes=2", "train"}).find("--standalone runs one node"),
            std::string::npos);
  EXPECT_NE(error_of({"--run_path", "-m", "pkg"}).find("--run-path runs a Python script"),
            std::string::npos);
}

TEST_F(LaunchPlanTest, GpuCountWithoutGpus) {
  if (cuda_device_count(env()) > 0) GTEST_SKIP() << "this machine has a GPU";
  EXPECT_NE(error_of({"--nproc_per_node=gpu", "train"}).find("no CUDA GPU"), std::string::npos);
  EXPECT_EQ(plan({"--nproc_per_node=cpu", "train"}).spec.local_world_size, usable_cpu_count());
  EXPECT_EQ(plan({"--nproc_per_node=auto", "train"}).spec.local_world_size, usable_cpu_count());
}

TEST_F(LaunchPlanTest, VisibleDeviceEntries) {
  EXPECT_EQ(visible_device_entries("0,1,2"), 3);
  EXPECT_EQ(visible_device_entries("0,-1,2"), 1);
  EXPECT_EQ(visible_device_entries(""), 0);
  EXPECT_EQ(visible_device_entries("GPU-abc,1"), 2);
}

// The single-node stores bind the address the user named (launcher/bind_hosts.hpp).
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

}  // namespace
}  // namespace ddprun::launcher

namespace ddprun::launcher {
namespace {

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
