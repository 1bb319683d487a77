// What each flag's value may be and where it goes in LaunchConfig: the `apply` functions of
// the flag table's rows (flags.cpp). Each throws CliError naming the value's source
// ("--nnodes=0: the number of nodes must be at least 1"). Internal to the launcher.
#pragma once

#include "launcher/flags.hpp"

namespace ddprun::launcher::flag_values {

// Switches ("1" on, "0" off).
void help(LaunchConfig& c, const FlagValue& v);
void version(LaunchConfig& c, const FlagValue& v);
void standalone(LaunchConfig& c, const FlagValue& v);
void virtual_local_rank(LaunchConfig& c, const FlagValue& v);
void in_process_recovery(LaunchConfig& c, const FlagValue& v);
void store_proxy(LaunchConfig& c, const FlagValue& v);
void module(LaunchConfig& c, const FlagValue& v);
void no_python(LaunchConfig& c, const FlagValue& v);
void run_path(LaunchConfig& c, const FlagValue& v);
void stop_on_stdin_eof(LaunchConfig& c, const FlagValue& v);

void print_completion(LaunchConfig& c, const FlagValue& v);

// Nodes and rendezvous.
void nnodes(LaunchConfig& c, const FlagValue& v);
void nproc_per_node(LaunchConfig& c, const FlagValue& v);
void node_rank(LaunchConfig& c, const FlagValue& v);
void rdzv_backend(LaunchConfig& c, const FlagValue& v);
void rdzv_endpoint(LaunchConfig& c, const FlagValue& v);
void rdzv_id(LaunchConfig& c, const FlagValue& v);
void rdzv_conf(LaunchConfig& c, const FlagValue& v);
void master_addr(LaunchConfig& c, const FlagValue& v);
void master_port(LaunchConfig& c, const FlagValue& v);
void local_addr(LaunchConfig& c, const FlagValue& v);

// Workers.
void max_restarts(LaunchConfig& c, const FlagValue& v);
void monitor_interval(LaunchConfig& c, const FlagValue& v);
void start_method(LaunchConfig& c, const FlagValue& v);
void event_log_handler(LaunchConfig& c, const FlagValue& v);
void role(LaunchConfig& c, const FlagValue& v);
void signals_to_handle(LaunchConfig& c, const FlagValue& v);
void shutdown_timeout(LaunchConfig& c, const FlagValue& v);
void numa_binding(LaunchConfig& c, const FlagValue& v);
void warm_start(LaunchConfig& c, const FlagValue& v);
void warm_start_modules(LaunchConfig& c, const FlagValue& v);
void memory_checkpoints(LaunchConfig& c, const FlagValue& v);

// Hangs, health and events.
void hang_timeout(LaunchConfig& c, const FlagValue& v);
void hang_start_timeout(LaunchConfig& c, const FlagValue& v);
void exit_timeout(LaunchConfig& c, const FlagValue& v);
void health_port(LaunchConfig& c, const FlagValue& v);
void health_host(LaunchConfig& c, const FlagValue& v);
void event_log(LaunchConfig& c, const FlagValue& v);

// Logs.
void log_dir(LaunchConfig& c, const FlagValue& v);
void redirects(LaunchConfig& c, const FlagValue& v);
void tee(LaunchConfig& c, const FlagValue& v);
void log_line_prefix_template(LaunchConfig& c, const FlagValue& v);
void local_ranks_filter(LaunchConfig& c, const FlagValue& v);
void duplicate_stdout_filters(LaunchConfig& c, const FlagValue& v);
void duplicate_stderr_filters(LaunchConfig& c, const FlagValue& v);
void logs_specs(LaunchConfig& c, const FlagValue& v);

// Several nodes over ssh.
void hosts(LaunchConfig& c, const FlagValue& v);
void hostfile(LaunchConfig& c, const FlagValue& v);
void include(LaunchConfig& c, const FlagValue& v);
void exclude(LaunchConfig& c, const FlagValue& v);
void ssh_command(LaunchConfig& c, const FlagValue& v);
void ssh_options(LaunchConfig& c, const FlagValue& v);
void ssh_port(LaunchConfig& c, const FlagValue& v);
void ssh_connect_timeout(LaunchConfig& c, const FlagValue& v);
void remote_ddprun(LaunchConfig& c, const FlagValue& v);
void exports(LaunchConfig& c, const FlagValue& v);

}  // namespace ddprun::launcher::flag_values
