#include "agent/worker_launch.hpp"

#include <unistd.h>

#include <map>

#include "agent/process/log_dir.hpp"
#include "agent/template.hpp"
#include "agent/worker_env.hpp"
#include "store/sys/log.hpp"

namespace ddprun::agent {
namespace {

std::string console_prefix(const WorkerGroup& group, int local_rank) {
  const WorkerSpec& spec = group.spec();
  const std::string templ = spec.log_line_prefix_template.empty()
                                ? std::string("[${role_name}${local_rank}]:")
                                : spec.log_line_prefix_template;
  const Worker& w = group.workers()[static_cast<size_t>(local_rank)];
  return safe_substitute(templ, {{"role_name", spec.role},
                                 {"local_rank", std::to_string(local_rank)},
                                 {"rank", std::to_string(w.global_rank)},
                                 {"hostname", sys::host_name()}});
}

StreamTarget stream_target(const WorkerGroup& group, int local_rank, Std which,
                           const std::string& rank_dir, const std::string& attempt_dir,
                           FilteredFiles& filtered) {
  const WorkerSpec& spec = group.spec();
  StreamTarget t;
  const bool shown = !spec.local_ranks_filter || spec.local_ranks_filter->count(local_rank) != 0;
  const bool tee = has(spec.tee.for_rank(local_rank), which);
  const bool redirect = tee || has(spec.redirects.for_rank(local_rank), which);
  const auto& filters =
      which == Std::kOut ? spec.duplicate_stdout_filters : spec.duplicate_stderr_filters;
  const char* name = which == Std::kOut ? "stdout" : "stderr";
  if (!redirect) {
    t.kind = shown ? StreamTarget::Kind::kInherit : StreamTarget::Kind::kDevNull;
    return t;
  }
  t.path = rank_dir + "/" + name + ".log";
  if (!tee || (!shown && filters.empty())) {
    t.kind = StreamTarget::Kind::kFile;
    return t;
  }
  t.kind = StreamTarget::Kind::kTee;
  t.console_fd = shown ? (which == Std::kOut ? STDOUT_FILENO : STDERR_FILENO) : -1;
  t.prefix = console_prefix(group, local_rank);
  if (!filters.empty()) {
    auto& shared = which == Std::kOut ? filtered.out : filtered.err;
    if (!shared) {
      shared = std::make_shared<sys::UniqueFd>(
          sys::open_for_write((attempt_dir + "/filtered_" + name + ".log").c_str()));
    }
    t.filtered_file = shared;
    t.filters = filters;
  }
  return t;
}

}  // namespace

std::vector<WorkerLaunch> make_launches(const WorkerGroup& group, const std::string& attempt_dir,
                                        FilteredFiles& filtered) {
  const WorkerSpec& spec = group.spec();
  filtered = {};
  std::vector<WorkerLaunch> launches;
  for (const Worker& w : group.workers()) {
    WorkerLaunch l;
    l.local_rank = w.local_rank;
    l.global_rank = w.global_rank;
    const std::string rank_dir = attempt_dir + "/" + std::to_string(w.local_rank);
    l.error_file = rank_dir + "/error.json";
    l.env = build_worker_env(group, w, l.error_file, flight_recorder_dir(attempt_dir),
                             spec.in_process_recovery ? recovery_dir(attempt_dir) : "");
    const std::map<std::string, std::string> macros{{"local_rank", std::to_string(w.local_rank)}};
    l.argv.push_back(spec.argv0);
    for (const auto& arg : spec.args) l.argv.push_back(safe_substitute(arg, macros));
    l.out = stream_target(group, w.local_rank, Std::kOut, rank_dir, attempt_dir, filtered);
    l.err = stream_target(group, w.local_rank, Std::kErr, rank_dir, attempt_dir, filtered);
    launches.push_back(std::move(l));
  }
  return launches;
}

}  // namespace ddprun::agent
