#include "launcher/flags.hpp"

#include <cctype>

namespace ddprun::launcher {

const std::vector<Flag>& flag_table() {
  static const std::vector<Flag> table = {
      {"help", 'h', false, "", "show this help and exit", "general"},
      {"version", 0, false, "", "print ddprun's version and exit", "general"},
      {"nnodes", 0, true, "N|MIN:MAX",
       "nodes in the job, or MIN:MAX for an elastic job (c10d backend) (default 1:1)", "nodes"},
      {"nproc_per_node", 0, true, "N|cpu|gpu|auto",
       "workers on this node: a number, cpu (cores), gpu (CUDA devices), auto (default 1)",
       "nodes"},
      {"node_rank", 0, true, "N",
       "this node's rank (static backend); with c10d a hint, honoured when free (default 0)",
       "nodes"},
      {"rdzv_backend", 0, true, "NAME",
       "static (default: node 0 hosts the store at --master-addr:--master-port), c10d "
       "(elastic, through --rdzv-endpoint) or etcd (elastic, on etcd's v3 API; etcd-v2 and "
       "etcd-v3 are the same)",
       "rendezvous"},
      {"rdzv_endpoint", 0, true, "HOST[:PORT]",
       "c10d: the rendezvous store every node reaches, a ddpstore or the agent on HOST "
       "(default port 29400); etcd: its members, HOST[:PORT],HOST[:PORT],... (default 2379)",
       "rendezvous"},
      {"rdzv_id", 0, true, "ID",
       "job id shared by the nodes of one job; jobs on one store need different ids "
       "(default none)",
       "rendezvous"},
      {"rdzv_conf", 0, true, "K=V,...",
       "seconds: join_timeout=600, last_call_timeout=30, close_timeout=30, read_timeout=60, "
       "keep_alive_interval=5, keep_alive_max_attempt=3 (a count), exit_barrier_timeout=300; "
       "is_host=true|false, store_type=tcp; token_file=PATH: the rendezvous store's secret "
       "(the same file on every node, and ddpstore --token-file PATH; strangers are refused); "
       "etcd: protocol=http|https, cacert=PATH, cert=PATH, key=PATH (or ca_cert, ssl_cert, "
       "ssl_cert_key); accepted, unused: heartbeat_timeout, use_libuv",
       "rendezvous"},
      {"standalone", 0, false, "",
       "one node, a store on a free loopback port and a fresh run id (overrides the rdzv flags)",
       "rendezvous"},
      {"master_addr", 0, true, "HOST",
       "static backend: node 0's address, where the rendezvous store listens (default "
       "127.0.0.1)",
       "rendezvous"},
      {"master_port", 0, true, "PORT",
       "static backend: the store's port (default: a free port on one node, 29500 for more)",
       "rendezvous"},
      {"local_addr", 0, true, "HOST",
       "this node's address as the other nodes reach it; MASTER_ADDR when it is node rank 0 "
       "(default: the host name)",
       "rendezvous"},
      {"max_restarts", 0, true, "N",
       "restarts of the worker group before failing (default 0); several nodes share one "
       "budget, the first node's",
       "workers"},
      {"monitor_interval", 0, true, "SECONDS",
       "accepted for compatibility; ddprun notices exits at once, it never polls", "workers"},
      {"start_method", 0, true, "spawn|fork|forkserver",
       "accepted for compatibility; programs are always fork+exec'd", "workers"},
      {"event_log_handler", 0, true, "NAME", "accepted for compatibility (only null)", "workers"},
      {"role", 0, true, "NAME", "worker role: ROLE_NAME and the log prefix (default default)",
       "workers"},
      {"signals_to_handle", 0, true, "SIG,...",
       "signals forwarded to the workers (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)", "workers"},
      {"shutdown_timeout", 0, true, "SECONDS",
       "grace between the forwarded signal and SIGKILL (default 30)", "workers"},
      {"virtual_local_rank", 0, false, "",
       "every worker gets LOCAL_RANK=0 and only its own device in CUDA_VISIBLE_DEVICES", "workers"},
      {"hang_timeout", 0, true, "SECONDS",
       "a worker that has sent a heartbeat and then none for SECONDS is hung: its stacks are "
       "saved and the group restarts (default 0: off; README \"Hangs, health and events\")",
       "health"},
      {"hang_start_timeout", 0, true, "SECONDS",
       "a worker that sends no first heartbeat within SECONDS of its start is hung (default 0: "
       "off)",
       "health"},
      {"exit_timeout", 0, true, "SECONDS",
       "once a worker exited 0, the others must exit within SECONDS, else their stacks are "
       "saved and they are stopped; the job still succeeds (default 300, 0: off)",
       "health"},
      {"health_port", 0, true, "PORT",
       "serve /healthz, /metrics (Prometheus) and /status (JSON) over HTTP on PORT (0: a free "
       "port; default: $TORCHELASTIC_HEALTH_CHECK_PORT, else none)",
       "health"},
      {"health_host", 0, true, "ADDRESS",
       "the address the health endpoints listen on (default 127.0.0.1)", "health"},
      {"event_log", 0, true, "FILE",
       "append one JSON object per line for every transition, round, worker start and exit, "
       "hang and restart",
       "health"},
      {"module", 'm', false, "", "run the entrypoint as a Python module (python -u -m MODULE)",
       "entrypoint"},
      {"no_python", 0, false, "", "exec the entrypoint directly instead of through Python",
       "entrypoint"},
      {"run_path", 0, false, "", "torchrun's in-interpreter mode; not available in ddprun",
       "entrypoint"},
      {"log_dir", 0, true, "DIR", "base directory for the logs (default: a temporary directory)",
       "logs"},
      {"redirects", 'r', true, "0-3|R:V,...",
       "send streams to log files: 0 none, 1 stdout, 2 stderr, 3 both, or per rank 0:1,1:2",
       "logs"},
      {"tee", 't', true, "0-3|R:V,...",
       "like --redirects, and also to the console with a [role N]: prefix", "logs"},
      {"log_line_prefix_template", 0, true, "TEMPLATE",
       "console prefix of tee'd lines; ${role_name} ${local_rank} ${rank} ${hostname}", "logs"},
      {"local_ranks_filter", 0, true, "R,...", "only these local ranks' output reaches the console",
       "logs"},
      {"duplicate_stdout_filters", 0, true, "S,...",
       "tee'd stdout lines containing one of these go to filtered_stdout.log too", "logs"},
      {"duplicate_stderr_filters", 0, true, "S,...",
       "tee'd stderr lines containing one of these go to filtered_stderr.log too", "logs"},
      {"logs_specs", 0, true, "NAME", "torchrun's Python plugin hook; not available in ddprun",
       "logs"},
      {"numa_binding", 0, true, "MODE", "torchrun's NUMA binding; not available yet in ddprun",
       "workers"},
      {"hosts", 0, true, "HOST,...",
       "start the job on these hosts over ssh, one node each, in this order (node 0 hosts the "
       "store); the flags go to every node (README \"Several nodes over ssh\")",
       "ssh"},
      {"hostfile", 0, true, "FILE",
       "like --hosts, from a file of 'HOST slots=N' lines (# comments); N workers on that host "
       "unless --nproc-per-node is given",
       "ssh"},
      {"include", 0, true, "HOST[:S,...]@...",
       "only these hosts, or only these slots of a host (its CUDA_VISIBLE_DEVICES, as many "
       "workers)",
       "ssh"},
      {"exclude", 0, true, "HOST[:S,...]@...", "all hosts but these, or without these slots",
       "ssh"},
      {"ssh_command", 0, true, "CMD", "the ssh program and leading words (default ssh)", "ssh"},
      {"ssh_options", 0, true, "\"OPTS\"",
       "more words for ssh, split like a shell, before ddprun's own -o BatchMode=yes "
       "-o ConnectTimeout=... (ssh keeps the first value of an option)",
       "ssh"},
      {"ssh_port", 0, true, "PORT", "ssh -p PORT", "ssh"},
      {"ssh_connect_timeout", 0, true, "SECONDS",
       "ssh's ConnectTimeout, also how long the reachability check waits (default 10)", "ssh"},
      {"remote_ddprun", 0, true, "PATH",
       "ddprun's path on the hosts (default: this ddprun's own absolute path)", "ssh"},
      {"export", 0, true, "NAME[=VALUE],...",
       "send these variables (their values here, or VALUE) to every node, after .ddprunenv's",
       "ssh"},
      {"stop_on_stdin_eof", 0, false, "",
       "stop the job as on SIGTERM when stdin reaches EOF (what a launch over ssh gives each "
       "node, so a lost connection stops its workers)",
       "ssh"},
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
