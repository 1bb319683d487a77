// make_launch_plan: entrypoints, rendezvous choices, multi-node and etcd plans, devices
// (binding, hang and health flags, torchrun conformance: launch_plan_options_test.cpp).
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
#include "launcher/launch_plan_test_util.hpp"

namespace ddprun::launcher {
namespace {

using test::LaunchPlanTest;

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
}  // namespace
}  // namespace ddprun::launcher
