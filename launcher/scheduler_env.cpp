#include "launcher/scheduler_env.hpp"

#include <algorithm>

#include "launcher/flags.hpp"
#include "launcher/hostlist.hpp"

namespace ddprun::launcher {
namespace {

// A variable and its value; `name` empty when none of the candidates is set (or all are empty).
struct Var {
  std::string name;
  std::string value;
  explicit operator bool() const { return !name.empty(); }
};

Var first_of(const GetEnv& getenv, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (auto v = getenv(n); v && !v->empty()) return {n, *v};
  }
  return {};
}

// The values a step implies, read and checked only as far as the wanted flags need them.
class SlurmStep {
 public:
  SlurmStep(const GetEnv& getenv, Var job) : getenv_(getenv), job_(std::move(job)) {}

  const Var& job() const { return job_; }

  long long job_number() {
    auto n = parse_int(job_.value);
    if (!n || *n < 0) fail(job_, "not a job number");
    return *n;
  }

  long long node_count() {
    if (!nodes_) nodes_ = first_of(getenv_, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"});
    if (!nodes_) throw Missing{"SLURM_STEP_NUM_NODES"};
    auto n = parse_int(nodes_.value);
    if (!n || *n < 1 || *n > 1000000) fail(nodes_, "not a number of nodes");
    return *n;
  }

  // One ddprun per node: more tasks than nodes would give two agents the same node rank.
  void check_one_task_per_node() {
    Var tasks = first_of(getenv_, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"});
    if (!tasks) return;
    auto n = parse_int(tasks.value);
    if (n && *n != node_count()) {
      throw Error{"the step runs " + tasks.value + " tasks on " + nodes_.value +
                  " nodes; ddprun starts the workers of a node itself, so run one ddprun per "
                  "node (srun --ntasks-per-node=1)"};
    }
  }

  long long node_id() {
    Var id = first_of(getenv_, {"SLURM_NODEID"});
    if (!id) throw Missing{"SLURM_NODEID"};
    long long count = node_count();
    auto n = parse_int(id.value);
    if (!n || *n < 0 || *n >= count) {
      fail(id, "not a node index below " + nodes_.name + "=" + nodes_.value);
    }
    return *n;
  }

  const Var& node_list_var() const { return list_; }

  std::string first_host() {
    list_ = first_of(getenv_, {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"});
    if (!list_) throw Missing{"SLURM_STEP_NODELIST"};
    Hostlist hosts = expand_hostlist(list_.value);
    if (!hosts.error.empty()) throw Error{list_.name + ": " + hosts.error};
    if (static_cast<long long>(hosts.hosts.size()) != node_count()) {
      throw Error{list_.name + "=" + list_.value + " names " + std::to_string(hosts.hosts.size()) +
                  " hosts but " + nodes_.name + "=" + nodes_.value};
    }
    return hosts.hosts.front();
  }

  const Var& nodes_var() const { return nodes_; }

  struct Error {
    std::string what;
  };
  struct Missing {
    std::string name;
  };

 private:
  [[noreturn]] static void fail(const Var& v, const std::string& what) {
    throw Error{v.name + "=" + v.value + ": " + what};
  }

  const GetEnv& getenv_;
  Var job_;
  Var nodes_;
  Var list_;
};

// What --rdzv-backend chose decides which flags a step implies.
std::vector<std::string> wanted_flags(agent::Backend backend) {
  switch (backend) {
    case agent::Backend::kC10d:
      return {"nnodes", "node_rank", "rdzv_endpoint", "rdzv_id"};
    case agent::Backend::kEtcd:
      return {"nnodes", "node_rank", "rdzv_id"};
    case agent::Backend::kStatic:
      break;
  }
  return {"nnodes", "node_rank", "master_addr", "master_port", "rdzv_id"};
}

void add_source(std::vector<std::string>& sources, const std::string& name) {
  if (std::find(sources.begin(), sources.end(), name) == sources.end()) sources.push_back(name);
}

std::string notice_of(const std::vector<DerivedFlag>& flags, const std::vector<std::string>& src) {
  std::string line = "slurm:";
  for (const auto& f : flags) line += " " + dashed(f.name) + "=" + f.value;
  line += " (from ";
  for (size_t i = 0; i < src.size(); ++i) line += (i ? ", " : "") + src[i];
  return line + ")";
}

SchedulerFlags derive_slurm(SlurmStep& step, const std::vector<std::string>& wanted) {
  SchedulerFlags out;
  std::vector<std::string> sources;
  auto add = [&](const std::string& name, std::string value, const std::string& source) {
    out.flags.push_back({name, std::move(value), source});
  };
  for (const std::string& name : wanted) {
    if (name == "nnodes") {
      step.check_one_task_per_node();
      add(name, std::to_string(step.node_count()), step.nodes_var().name);
      add_source(sources, step.nodes_var().name);
    } else if (name == "node_rank") {
      step.check_one_task_per_node();
      add(name, std::to_string(step.node_id()), "SLURM_NODEID");
      add_source(sources, "SLURM_NODEID");
    } else if (name == "master_addr" || name == "rdzv_endpoint") {
      std::string host = step.first_host();
      if (name == "rdzv_endpoint") {
        host += ":" + std::to_string(slurm_master_port(step.job_number()));
        add_source(sources, step.node_list_var().name);
        add_source(sources, step.job().name);
      }
      add(name, host, step.node_list_var().name);
      add_source(sources, step.node_list_var().name);
    } else if (name == "master_port") {
      add(name, std::to_string(slurm_master_port(step.job_number())), step.job().name);
      add_source(sources, step.job().name);
    } else if (name == "rdzv_id") {
      add(name, step.job().value, step.job().name);
      add_source(sources, step.job().name);
    }
  }
  if (!out.flags.empty()) out.notice = notice_of(out.flags, sources);
  return out;
}

}  // namespace

SchedulerFlags derive_scheduler_flags(const GetEnv& getenv, const std::set<std::string>& given,
                                      agent::Backend backend, bool standalone) {
  Var job = first_of(getenv, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!job || standalone) return {};
  std::vector<std::string> wanted;
  for (auto& name : wanted_flags(backend)) {
    if (!given.count(name)) wanted.push_back(name);
  }
  if (wanted.empty()) return {};
  if (!first_of(getenv, {"SLURM_STEP_ID", "SLURM_STEPID"})) {
    SchedulerFlags out;
    out.notice = "slurm: job " + job.value +
                 " but not inside an srun step (a batch script or an salloc shell): nothing "
                 "derived, this ddprun runs one node; start it with srun --ntasks-per-node=1 "
                 "for a job across the allocation's nodes";
    return out;
  }
  SlurmStep step(getenv, job);
  try {
    return derive_slurm(step, wanted);
  } catch (const SlurmStep::Error& e) {
    SchedulerFlags out;
    out.error = "slurm: " + e.what;
    return out;
  } catch (const SlurmStep::Missing& m) {
    SchedulerFlags out;
    out.error = "slurm: inside step " + job.value + " but " + m.name +
                " is not set; give --nnodes, --node-rank and --master-addr yourself";
    return out;
  }
}

int slurm_master_port(unsigned long long job_id) {
  return 15000 + static_cast<int>(job_id % 10000);
}

std::optional<int> slurm_gpus_on_node(const GetEnv& getenv) {
  if (!first_of(getenv, {"SLURM_JOB_ID", "SLURM_JOBID"})) return std::nullopt;
  if (!first_of(getenv, {"SLURM_STEP_ID", "SLURM_STEPID"})) return std::nullopt;
  Var gpus = first_of(getenv, {"SLURM_GPUS_ON_NODE"});
  if (!gpus) return std::nullopt;
  auto n = parse_int(gpus.value);
  if (!n || *n < 0 || *n > 65536) return std::nullopt;
  return static_cast<int>(*n);
}

}  // namespace ddprun::launcher
