#include "launcher/flags.hpp"

#include <cctype>
#include <stdexcept>

#include "launcher/flag_values.hpp"

namespace ddprun::launcher {

const std::vector<Flag>& flag_table() {
  namespace v = flag_values;
  using F = Fanout;
  static const std::vector<Flag> table = {
      {.name = "help",
       .short_name = 'h',
       .takes_value = false,
       .apply = v::help,
       .fanout = F::kLauncher,
       .help = "show this help and exit",
       .group = "general"},
      {.name = "version",
       .takes_value = false,
       .apply = v::version,
       .fanout = F::kLauncher,
       .help = "print ddprun's version and exit",
       .group = "general"},
      {.name = "print_completion",
       .metavar = "bash|zsh|tcsh",
       .apply = v::print_completion,
       .fanout = F::kLauncher,
       .help = "print a shell completion script for ddprun and exit (bash: source <(ddprun "
               "--print-completion bash))",
       .group = "general"},

      {.name = "nnodes",
       .metavar = "N|MIN:MAX",
       .default_value = "1:1",
       .apply = v::nnodes,
       .fanout = F::kReplaced,
       .help = "nodes in the job, or MIN:MAX for an elastic job (c10d or etcd backend)",
       .group = "nodes"},
      {.name = "nproc_per_node",
       .metavar = "N|cpu|gpu|auto",
       .default_value = "1",
       .apply = v::nproc_per_node,
       .fanout = F::kReplaced,
       .help = "workers on this node: a number, cpu (cores), gpu (CUDA devices), auto (GPUs, "
               "else cores)",
       .group = "nodes"},
      {.name = "node_rank",
       .metavar = "N",
       .default_value = "0",
       .apply = v::node_rank,
       .fanout = F::kPerNode,
       .help = "this node's rank (static backend); with c10d or etcd a hint, honoured when free",
       .group = "nodes"},

      {.name = "rdzv_backend",
       .metavar = "NAME",
       .default_value = "static",
       .apply = v::rdzv_backend,
       .help = "static (node 0 hosts the store at --master-addr:--master-port), c10d (elastic, "
               "through --rdzv-endpoint) or etcd (elastic, on etcd's v3 API; etcd-v2 and "
               "etcd-v3 are the same)",
       .group = "rendezvous"},
      {.name = "rdzv_endpoint",
       .metavar = "HOST[:PORT]",
       .apply = v::rdzv_endpoint,
       .help = "c10d: the rendezvous store every node reaches, a ddpstore or the agent on HOST "
               "(port 29400 when none is given); etcd: its members, HOST[:PORT],HOST[:PORT],... "
               "(port 2379); static: overrides --master-addr and --master-port",
       .group = "rendezvous"},
      {.name = "rdzv_id",
       .metavar = "ID",
       .default_value = "none",
       .apply = v::rdzv_id,
       .help = "job id shared by the nodes of one job; jobs on one store need different ids",
       .group = "rendezvous"},
      {.name = "rdzv_conf",
       .metavar = "K=V,...",
       .apply = v::rdzv_conf,
       .help = "seconds: join_timeout=600 (static: timeout=600), last_call_timeout=30, "
               "close_timeout=30, read_timeout=60, keep_alive_interval=5, "
               "keep_alive_max_attempt=3 (a count), exit_barrier_timeout=300; is_host=true|false "
               "and store_type=tcp (c10d); token_file=PATH: the rendezvous store's secret (the "
               "same file on every node, and ddpstore --token-file PATH); etcd: protocol=http|"
               "https, cacert=PATH, cert=PATH, key=PATH (or ca_cert, ssl_cert, ssl_cert_key). "
               "Each key is read by the backends torchrun reads it with; elsewhere it gets a "
               "notice and is not read",
       .group = "rendezvous"},
      {.name = "standalone",
       .takes_value = false,
       .apply = v::standalone,
       .fanout = F::kPerNode,
       .help = "one node, a store on a free loopback port and a fresh run id (overrides the "
               "rdzv flags)",
       .group = "rendezvous"},
      {.name = "master_addr",
       .metavar = "HOST",
       .default_value = "127.0.0.1",
       .apply = v::master_addr,
       .fanout = F::kReplaced,
       .help = "static backend: node 0's address, where the rendezvous store listens",
       .group = "rendezvous"},
      {.name = "master_port",
       .metavar = "PORT",
       .apply = v::master_port,
       .fanout = F::kReplaced,
       .help = "static backend: the store's port (when none is given: a free port on one node, "
               "29500 for more)",
       .group = "rendezvous"},
      {.name = "local_addr",
       .metavar = "HOST",
       .apply = v::local_addr,
       .fanout = F::kPerNode,
       .help = "this node's address as the other nodes reach it; MASTER_ADDR when it is node "
               "rank 0 (when none is given: the host name)",
       .group = "rendezvous"},

      {.name = "max_restarts",
       .metavar = "N",
       .default_value = "0",
       .apply = v::max_restarts,
       .help = "restarts of the worker group before failing; several nodes share one budget, "
               "the first node's",
       .group = "workers"},
      {.name = "monitor_interval",
       .metavar = "SECONDS",
       .default_value = "0.1",
       .apply = v::monitor_interval,
       .help = "accepted for compatibility; ddprun notices exits at once, it never polls",
       .group = "workers"},
      {.name = "start_method",
       .metavar = "spawn|fork|forkserver",
       .default_value = "spawn",
       .apply = v::start_method,
       .help = "accepted for compatibility; programs are always fork+exec'd",
       .group = "workers"},
      {.name = "event_log_handler",
       .metavar = "NAME",
       .default_value = "null",
       .apply = v::event_log_handler,
       .help = "accepted for compatibility (only null)",
       .group = "workers"},
      {.name = "role",
       .metavar = "NAME",
       .default_value = "default",
       .apply = v::role,
       .help = "worker role: ROLE_NAME and the log prefix",
       .group = "workers"},
      {.name = "signals_to_handle",
       .metavar = "SIG,...",
       .default_value = "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
       .apply = v::signals_to_handle,
       .help = "signals forwarded to the workers",
       .group = "workers"},
      {.name = "shutdown_timeout",
       .metavar = "SECONDS",
       .default_value = "30",
       .env = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
       .apply = v::shutdown_timeout,
       .help = "grace between the forwarded signal and SIGKILL",
       .group = "workers"},
      {.name = "virtual_local_rank",
       .takes_value = false,
       .apply = v::virtual_local_rank,
       .help = "every worker gets LOCAL_RANK=0 and only its own device in CUDA_VISIBLE_DEVICES",
       .group = "workers"},
      {.name = "warm_start",
       .metavar = "auto|on|off",
       .default_value = "auto",
       .apply = v::warm_start,
       .help = "fork a Python entrypoint's workers, at every start, from a zygote that has "
               "imported --warm-start-modules, so a restart skips the imports; auto: on when "
               "workers may start more than once (--max-restarts above 0, or an elastic "
               "c10d/etcd job) (docs/recovery.md)",
       .group = "workers"},
      {.name = "warm_start_modules",
       .metavar = "M,...",
       .default_value = "torch,torch.distributed,torch._dynamo",
       .apply = v::warm_start_modules,
       .help = "what the warm-start zygote imports before forking (a missing one is skipped)",
       .group = "workers"},
      {.name = "memory_checkpoints",
       .metavar = "SIZE|N%|off",
       .default_value = "25%",
       .apply = v::memory_checkpoints,
       .help = "bound of the job's in-memory checkpoints: a tmpfs directory private to the job "
               "that outlives its workers (DDPRUN_MEMORY_CHECKPOINT_DIR), removed when the job "
               "ends; a size (8G), a share of the node's memory, or off (docs/recovery.md)",
       .group = "workers"},
      {.name = "numa_binding",
       .metavar = "MODE",
       .apply = v::numa_binding,
       .help = "torchrun's NUMA binding; not available yet in ddprun",
       .group = "workers"},

      {.name = "hang_timeout",
       .metavar = "SECONDS",
       .default_value = "0",
       .apply = v::hang_timeout,
       .help = "a worker that has sent a heartbeat and then none for SECONDS is hung: its stacks "
               "are saved and the group restarts (0: off; docs/hangs-health-events.md)",
       .group = "health"},
      {.name = "hang_start_timeout",
       .metavar = "SECONDS",
       .default_value = "0",
       .apply = v::hang_start_timeout,
       .help = "a worker that sends no first heartbeat within SECONDS of its start is hung "
               "(0: off)",
       .group = "health"},
      {.name = "exit_timeout",
       .metavar = "SECONDS",
       .default_value = "300",
       .apply = v::exit_timeout,
       .help = "once a worker exited 0, the others must exit within SECONDS, else their stacks "
               "are saved and they are stopped; the job still succeeds (0: off)",
       .group = "health"},
      {.name = "health_port",
       .metavar = "PORT",
       .env = "TORCHELASTIC_HEALTH_CHECK_PORT",
       .apply = v::health_port,
       .help = "serve /healthz, /metrics (Prometheus) and /status (JSON) over HTTP on PORT (0: a "
               "free port; none: no endpoints)",
       .group = "health"},
      {.name = "health_host",
       .metavar = "ADDRESS",
       .default_value = "127.0.0.1",
       .apply = v::health_host,
       .help = "the address the health endpoints listen on",
       .group = "health"},
      {.name = "event_log",
       .metavar = "FILE",
       .apply = v::event_log,
       .help = "append one JSON object per line for every transition, round, worker start and "
               "exit, hang and restart",
       .group = "health"},

      {.name = "module",
       .short_name = 'm',
       .takes_value = false,
       .apply = v::module,
       .help = "run the entrypoint as a Python module (python -u -m MODULE)",
       .group = "entrypoint"},
      {.name = "no_python",
       .takes_value = false,
       .apply = v::no_python,
       .help = "exec the entrypoint directly instead of through Python",
       .group = "entrypoint"},
      {.name = "run_path",
       .takes_value = false,
       .apply = v::run_path,
       .help = "accepted for compatibility: the entrypoint is a Python script whatever its name, "
               "run in a python3 -u of its own as without it",
       .group = "entrypoint"},

      {.name = "log_dir",
       .metavar = "DIR",
       .apply = v::log_dir,
       .help = "base directory for the logs (when none is given: a temporary directory)",
       .group = "logs"},
      {.name = "redirects",
       .short_name = 'r',
       .metavar = "0-3|R:V,...",
       .default_value = "0",
       .apply = v::redirects,
       .help = "send streams to log files: 0 none, 1 stdout, 2 stderr, 3 both, or per rank "
               "0:1,1:2",
       .group = "logs"},
      {.name = "tee",
       .short_name = 't',
       .metavar = "0-3|R:V,...",
       .default_value = "0",
       .apply = v::tee,
       .help = "like --redirects, and also to the console with a [role N]: prefix",
       .group = "logs"},
      {.name = "log_line_prefix_template",
       .metavar = "TEMPLATE",
       .env = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
       .apply = v::log_line_prefix_template,
       .help = "console prefix of tee'd lines; ${role_name} ${local_rank} ${rank} ${hostname} "
               "(when none is given: [${role_name}${local_rank}]:)",
       .group = "logs"},
      {.name = "local_ranks_filter",
       .metavar = "R,...",
       .apply = v::local_ranks_filter,
       .help = "only these local ranks' output reaches the console",
       .group = "logs"},
      {.name = "duplicate_stdout_filters",
       .metavar = "S,...",
       .apply = v::duplicate_stdout_filters,
       .help = "tee'd stdout lines containing one of these go to filtered_stdout.log too",
       .group = "logs"},
      {.name = "duplicate_stderr_filters",
       .metavar = "S,...",
       .apply = v::duplicate_stderr_filters,
       .help = "tee'd stderr lines containing one of these go to filtered_stderr.log too",
       .group = "logs"},
      {.name = "logs_specs",
       .metavar = "NAME",
       .apply = v::logs_specs,
       .help = "torchrun's log layout plugin: only default, the layout ddprun writes",
       .group = "logs"},

      {.name = "hosts",
       .metavar = "HOST,...",
       .apply = v::hosts,
       .fanout = F::kLauncher,
       .help = "start the job on these hosts over ssh, one node each, in this order (node 0 "
               "hosts the store); the flags go to every node (docs/multi-node.md)",
       .group = "ssh"},
      {.name = "hostfile",
       .metavar = "FILE",
       .apply = v::hostfile,
       .fanout = F::kLauncher,
       .help = "like --hosts, from a file of 'HOST slots=N' lines (# comments); N workers on that "
               "host unless --nproc-per-node is given",
       .group = "ssh"},
      {.name = "include",
       .metavar = "HOST[:S,...]@...",
       .apply = v::include,
       .fanout = F::kLauncher,
       .help = "only these hosts, or only these slots of a host (its CUDA_VISIBLE_DEVICES, as "
               "many workers)",
       .group = "ssh"},
      {.name = "exclude",
       .metavar = "HOST[:S,...]@...",
       .apply = v::exclude,
       .fanout = F::kLauncher,
       .help = "all hosts but these, or without these slots",
       .group = "ssh"},
      {.name = "ssh_command",
       .metavar = "CMD",
       .default_value = "ssh",
       .apply = v::ssh_command,
       .fanout = F::kLauncher,
       .help = "the ssh program and leading words",
       .group = "ssh"},
      {.name = "ssh_options",
       .metavar = "\"OPTS\"",
       .apply = v::ssh_options,
       .fanout = F::kLauncher,
       .help = "more words for ssh, split like a shell, before ddprun's own -o BatchMode=yes "
               "-o ConnectTimeout=... (ssh keeps the first value of an option)",
       .group = "ssh"},
      {.name = "ssh_port",
       .metavar = "PORT",
       .apply = v::ssh_port,
       .fanout = F::kLauncher,
       .help = "ssh -p PORT",
       .group = "ssh"},
      {.name = "ssh_connect_timeout",
       .metavar = "SECONDS",
       .default_value = "10",
       .apply = v::ssh_connect_timeout,
       .fanout = F::kLauncher,
       .help = "ssh's ConnectTimeout, also how long the reachability check waits",
       .group = "ssh"},
      {.name = "remote_ddprun",
       .metavar = "PATH",
       .apply = v::remote_ddprun,
       .fanout = F::kLauncher,
       .help = "ddprun's path on the hosts (when none is given: this ddprun's own absolute path)",
       .group = "ssh"},
      {.name = "export",
       .metavar = "NAME[=VALUE],...",
       .apply = v::exports,
       .fanout = F::kLauncher,
       .help = "send these variables (their values here, or VALUE) to every node, after "
               ".ddprunenv's",
       .group = "ssh"},
      {.name = "stop_on_stdin_eof",
       .takes_value = false,
       .apply = v::stop_on_stdin_eof,
       .fanout = F::kReplaced,
       .help = "stop the job as on SIGTERM when stdin reaches EOF (what a launch over ssh gives "
               "each node, so a lost connection stops its workers)",
       .group = "ssh"},
  };
  return table;
}

namespace {

std::string normalize(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c == '-') c = '_';
  }
  return out;
}

}  // namespace

const Flag* find_long_flag(std::string_view spelling, bool& ambiguous) {
  ambiguous = false;
  const std::string key = normalize(spelling);
  const Flag* prefix_match = nullptr;
  int prefix_matches = 0;
  for (const Flag& f : flag_table()) {
    if (f.name == key) return &f;
    if (!key.empty() && f.name.starts_with(key)) {
      prefix_match = &f;
      ++prefix_matches;
    }
  }
  if (prefix_matches == 1) return prefix_match;
  ambiguous = prefix_matches > 1;
  return nullptr;
}

const Flag& flag_named(std::string_view name) {
  for (const Flag& f : flag_table()) {
    if (f.name == name) return f;
  }
  throw std::logic_error("no flag named " + std::string(name));
}

const Flag* find_short_flag(char c) {
  for (const Flag& f : flag_table()) {
    if (f.short_name == c) return &f;
  }
  return nullptr;
}

std::string pet_variable(std::string_view name) {
  std::string out = "PET_";
  for (char c : name) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string dashed(std::string_view name) {
  std::string out = "--";
  for (char c : name) out += c == '_' ? '-' : c;
  return out;
}

}  // namespace ddprun::launcher
