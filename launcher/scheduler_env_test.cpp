#include "launcher/scheduler_env.hpp"

#include <gtest/gtest.h>

#include <map>

namespace ddprun::launcher {
namespace {

using Vars = std::map<std::string, std::string>;

GetEnv env_of(const Vars& vars) {
  return [vars](const std::string& n) -> std::optional<std::string> {
    auto it = vars.find(n);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// What srun sets on node 2 of a 4-node step with one task per node (Slurm 22.05, as seen in
// tests/slurm), plus the job's variables a batch script passes down.
Vars srun_step() {
  return {{"SLURM_JOB_ID", "1234"},
          {"SLURM_JOBID", "1234"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEPID", "0"},
          {"SLURM_NNODES", "4"},
          {"SLURM_JOB_NUM_NODES", "4"},
          {"SLURM_STEP_NUM_NODES", "4"},
          {"SLURM_NODEID", "2"},
          {"SLURM_PROCID", "2"},
          {"SLURM_STEP_NUM_TASKS", "4"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_JOB_NODELIST", "rack0-n[01-04]"},
          {"SLURM_NODELIST", "rack0-n[01-04]"},
          {"SLURM_STEP_NODELIST", "rack0-n[01-04]"}};
}

std::map<std::string, std::string> flags_of(const SchedulerFlags& d) {
  std::map<std::string, std::string> out;
  for (const auto& f : d.flags) out[f.name] = f.value;
  return out;
}

TEST(SchedulerEnv, SrunStepDerivesTheStaticJob) {
  SchedulerFlags d =
      derive_scheduler_flags(env_of(srun_step()), {}, agent::Backend::kStatic, false);
  EXPECT_EQ(d.error, "");
  EXPECT_EQ(flags_of(d), (std::map<std::string, std::string>{{"nnodes", "4"},
                                                             {"node_rank", "2"},
                                                             {"master_addr", "rack0-n01"},
                                                             {"master_port", "16234"},
                                                             {"rdzv_id", "1234"}}));
  EXPECT_EQ(d.notice,
            "slurm: --nnodes=4 --node-rank=2 --master-addr=rack0-n01 --master-port=16234 "
            "--rdzv-id=1234 (from SLURM_STEP_NUM_NODES, SLURM_NODEID, SLURM_STEP_NODELIST, "
            "SLURM_JOB_ID)");
}

TEST(SchedulerEnv, GivenFlagsAreNotDerived) {
  SchedulerFlags d = derive_scheduler_flags(env_of(srun_step()), {"nnodes", "master_port"},
                                            agent::Backend::kStatic, false);
  EXPECT_EQ(flags_of(d),
            (std::map<std::string, std::string>{
                {"node_rank", "2"}, {"master_addr", "rack0-n01"}, {"rdzv_id", "1234"}}));
  EXPECT_EQ(d.notice.find("--nnodes"), std::string::npos);
  auto all = derive_scheduler_flags(
      env_of(srun_step()), {"nnodes", "node_rank", "master_addr", "master_port", "rdzv_id"},
      agent::Backend::kStatic, false);
  EXPECT_TRUE(all.flags.empty());
  EXPECT_EQ(all.notice, "");
}

TEST(SchedulerEnv, StepVariablesWinOverTheJobs) {
  Vars v = srun_step();  // srun -N2 inside a 4-node allocation
  v["SLURM_STEP_NUM_NODES"] = "2";
  v["SLURM_STEP_NUM_TASKS"] = "2";
  v["SLURM_NODEID"] = "1";
  v["SLURM_STEP_NODELIST"] = "rack0-n[03-04]";
  auto f = flags_of(derive_scheduler_flags(env_of(v), {}, agent::Backend::kStatic, false));
  EXPECT_EQ(f["nnodes"], "2");
  EXPECT_EQ(f["master_addr"], "rack0-n03");
  // Without the step's variables (an older srun): SLURM_NNODES and SLURM_NODELIST.
  v = srun_step();
  v.erase("SLURM_STEP_NUM_NODES");
  v.erase("SLURM_STEP_NODELIST");
  v["SLURM_NODELIST"] = "a[1-3],b";
  SchedulerFlags d = derive_scheduler_flags(env_of(v), {}, agent::Backend::kStatic, false);
  EXPECT_EQ(flags_of(d)["master_addr"], "a1");
  EXPECT_NE(d.notice.find("(from SLURM_NNODES, SLURM_NODEID, SLURM_NODELIST, SLURM_JOB_ID)"),
            std::string::npos)
      << d.notice;
}

TEST(SchedulerEnv, BatchScriptOrSallocShellDerivesNothing) {
  // sbatch's batch step: SLURM_JOB_*, SLURM_NODEID=0 and SLURM_PROCID=0, no SLURM_STEP_ID.
  Vars v = srun_step();
  for (auto k : {"SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST",
                 "SLURM_STEP_NUM_TASKS"}) {
    v.erase(k);
  }
  v["SLURM_NODEID"] = "0";
  v["SLURM_PROCID"] = "0";
  SchedulerFlags d = derive_scheduler_flags(env_of(v), {}, agent::Backend::kStatic, false);
  EXPECT_TRUE(d.flags.empty());
  EXPECT_EQ(d.error, "");
  EXPECT_NE(d.notice.find("not inside an srun step"), std::string::npos) << d.notice;
}

TEST(SchedulerEnv, OutsideSlurmAndStandaloneDeriveNothing) {
  SchedulerFlags none = derive_scheduler_flags(env_of({}), {}, agent::Backend::kStatic, false);
  EXPECT_TRUE(none.flags.empty());
  EXPECT_EQ(none.notice + none.error, "");
  SchedulerFlags standalone =
      derive_scheduler_flags(env_of(srun_step()), {}, agent::Backend::kStatic, true);
  EXPECT_TRUE(standalone.flags.empty());
  EXPECT_EQ(standalone.notice + standalone.error, "");
}

TEST(SchedulerEnv, BackendDecidesWhatIsDerived) {
  auto c10d =
      flags_of(derive_scheduler_flags(env_of(srun_step()), {}, agent::Backend::kC10d, false));
  EXPECT_EQ(c10d, (std::map<std::string, std::string>{{"nnodes", "4"},
                                                      {"node_rank", "2"},
                                                      {"rdzv_endpoint", "rack0-n01:16234"},
                                                      {"rdzv_id", "1234"}}));
  auto etcd =
      flags_of(derive_scheduler_flags(env_of(srun_step()), {}, agent::Backend::kEtcd, false));
  EXPECT_EQ(etcd, (std::map<std::string, std::string>{
                      {"nnodes", "4"}, {"node_rank", "2"}, {"rdzv_id", "1234"}}));
}

TEST(SchedulerEnv, InconsistentStepsAreOneClearError) {
  struct Case {
    std::string var, value, error;
  };
  for (const auto& c : std::vector<Case>{
           {"SLURM_STEP_NUM_TASKS", "32", "runs 32 tasks on 4 nodes"},
           {"SLURM_STEP_NODELIST", "rack0-n[01-03]", "names 3 hosts but SLURM_STEP_NUM_NODES=4"},
           {"SLURM_STEP_NODELIST", "rack0-n[01-04", "unbalanced '['"},
           {"SLURM_NODEID", "4", "SLURM_NODEID=4: not a node index below"},
           {"SLURM_NODEID", "x", "SLURM_NODEID=x"},
           {"SLURM_STEP_NUM_NODES", "zero", "SLURM_STEP_NUM_NODES=zero"},
           {"SLURM_JOB_ID", "12a", "SLURM_JOB_ID=12a: not a job number"},
       }) {
    Vars v = srun_step();
    v[c.var] = c.value;
    SchedulerFlags d = derive_scheduler_flags(env_of(v), {}, agent::Backend::kStatic, false);
    EXPECT_NE(d.error.find(c.error), std::string::npos) << c.var << " -> " << d.error;
    EXPECT_EQ(d.error.rfind("slurm: ", 0), 0u) << d.error;
  }
  // A bad node list does not matter when --master-addr is given.
  Vars v = srun_step();
  v["SLURM_STEP_NODELIST"] = "rack0-n[01-04";
  EXPECT_EQ(
      derive_scheduler_flags(env_of(v), {"master_addr"}, agent::Backend::kStatic, false).error, "");
}

TEST(SchedulerEnv, MasterPortIsDeterministicAndInRange) {
  EXPECT_EQ(slurm_master_port(0), 15000);
  EXPECT_EQ(slurm_master_port(1234), 16234);
  EXPECT_EQ(slurm_master_port(9999), 24999);
  EXPECT_EQ(slurm_master_port(123456789), 21789);
  for (unsigned long long id = 0; id < 30000; id += 7) {
    int p = slurm_master_port(id);
    EXPECT_GE(p, 15000);
    EXPECT_LE(p, 24999);
  }
}

TEST(SchedulerEnv, GpusOnNodeOnlyInsideAStep) {
  Vars v = srun_step();
  v["SLURM_GPUS_ON_NODE"] = "4";
  EXPECT_EQ(slurm_gpus_on_node(env_of(v)), 4);
  v["SLURM_GPUS_ON_NODE"] = "0";
  EXPECT_EQ(slurm_gpus_on_node(env_of(v)), 0);
  v.erase("SLURM_STEP_ID");
  v.erase("SLURM_STEPID");
  EXPECT_EQ(slurm_gpus_on_node(env_of(v)), std::nullopt);
  EXPECT_EQ(slurm_gpus_on_node(env_of({{"SLURM_GPUS_ON_NODE", "2"}})), std::nullopt);
}

// Through the parser: the command line, then PET_*, then Slurm, then the defaults.
TEST(SchedulerEnv, ParserPrecedence) {
  Vars v = srun_step();
  v["PET_MASTER_ADDR"] = "pet-host";
  LaunchConfig c = parse_command_line({"--node-rank=3", "x.py"}, env_of(v));
  EXPECT_EQ(c.node_rank, 3);
  EXPECT_EQ(c.master_addr, "pet-host");
  EXPECT_EQ(c.max_nodes, 4);
  EXPECT_EQ(c.master_port, 16234);
  EXPECT_EQ(c.rdzv_id, "1234");
  ASSERT_EQ(c.notices.size(), 1u);
  EXPECT_EQ(c.notices[0],
            "slurm: --nnodes=4 --master-port=16234 --rdzv-id=1234 (from SLURM_STEP_NUM_NODES, "
            "SLURM_JOB_ID)");
  v["SLURM_STEP_NUM_TASKS"] = "8";
  try {
    parse_command_line({"x.py"}, env_of(v));
    ADD_FAILURE() << "no error";
  } catch (const CliError& e) {
    EXPECT_NE(std::string(e.what()).find("slurm: the step runs 8 tasks on 4 nodes"),
              std::string::npos)
        << e.what();
  }
  v = srun_step();
  v["SLURM_NODEID"] = "9";
  try {
    parse_command_line({"x.py"}, env_of(v));
    ADD_FAILURE() << "no error";
  } catch (const CliError& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_NODEID=9"), std::string::npos) << e.what();
  }
}

// Kubeflow's PyTorchJob writes PET_STANDALONE="" for standalone: true.
TEST(SchedulerEnv, EmptyPetSwitchIsOn) {
  LaunchConfig c = parse_command_line({"x.py"}, env_of({{"PET_STANDALONE", ""}}));
  EXPECT_TRUE(c.standalone);
  EXPECT_FALSE(parse_command_line({"x.py"}, env_of({{"PET_STANDALONE", "0"}})).standalone);
  EXPECT_EQ(parse_command_line({"x.py"}, env_of({{"PET_RDZV_ENDPOINT", ""}})).rdzv_endpoint, "");
  Vars v = srun_step();
  v["PET_STANDALONE"] = "";
  c = parse_command_line({"x.py"}, env_of(v));
  EXPECT_TRUE(c.notices.empty());
  EXPECT_EQ(c.max_nodes, 1);
}

}  // namespace
}  // namespace ddprun::launcher
