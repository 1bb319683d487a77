#include "launcher/fanout/reachability.hpp"

#include <fcntl.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <optional>

#include "launcher/fanout/ssh_process.hpp"
#include "store/sys/temp_dir.hpp"

namespace ddprun::launcher {
namespace {

namespace asio = boost::asio;

constexpr std::chrono::seconds kAnswerMargin{10};  // after the TCP connection: auth, the shell

// The last non-empty line ssh wrote, without its newline.
std::string last_line(const std::string& path) {
  auto text = read_text_file(path).value_or("");
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  size_t nl = text.rfind('\n');
  std::string line = nl == std::string::npos ? text : text.substr(nl + 1);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

std::string why(const agent::ExitStatus& st, const std::string& err_path, const FanoutPlan& plan) {
  if (st.kind == agent::ExitStatus::Kind::kExited && st.value == kProbeNoDirectory) {
    return "no directory " + plan.cwd + " there";
  }
  if (st.kind == agent::ExitStatus::Kind::kExited && st.value == kProbeNoDdprun) {
    return "no executable " + plan.remote_ddprun + " there (see --remote-ddprun)";
  }
  std::string line = last_line(err_path);
  return line.empty() ? "ssh " + st.describe() : line;
}

}  // namespace

std::vector<Unreachable> probe_hosts(const FanoutPlan& plan, const std::string& ssh_program) {
  asio::io_context io(1);
  sys::TempDir dir("ddprun_probe_");
  sys::UniqueFd dev_null(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  const size_t n = plan.nodes.size();
  std::vector<std::optional<agent::ExitStatus>> status(n);
  std::vector<std::unique_ptr<SshProcess>> probes;
  size_t left = n;
  asio::steady_timer deadline(io, plan.connect_timeout + kAnswerMargin);
  for (size_t i = 0; i < n; ++i) {
    const std::string err_path = dir.path() + "/" + std::to_string(i);
    sys::UniqueFd err = sys::open_for_write(err_path.c_str());
    std::vector<std::string> argv = plan.nodes[i].probe_argv;
    argv[0] = ssh_program;
    SshStreams streams;
    streams.stdout_fd = dev_null.get();
    streams.stderr_fd = err.get();
    probes.push_back(std::make_unique<SshProcess>(io, argv, streams, [&, i](agent::ExitStatus st) {
      status[i] = st;
      if (--left == 0) deadline.cancel();
    }));
  }
  deadline.async_wait([&](boost::system::error_code ec) {
    if (ec) return;
    for (auto& p : probes) p->kill();  // their exits arrive next, as signaled
  });
  io.run();
  std::vector<Unreachable> bad;
  const long secs =
      std::chrono::duration_cast<std::chrono::seconds>(plan.connect_timeout + kAnswerMargin)
          .count();
  for (size_t i = 0; i < n; ++i) {
    if (status[i] && status[i]->success()) continue;
    const std::string err_path = dir.path() + "/" + std::to_string(i);
    const bool killed = status[i] && status[i]->kind == agent::ExitStatus::Kind::kSignaled;
    bad.push_back({plan.nodes[i].host, killed ? "no answer within " + std::to_string(secs) + " s"
                                              : why(*status[i], err_path, plan)});
  }
  return bad;
}

std::string unreachable_line(const std::vector<Unreachable>& bad, size_t hosts) {
  std::string line = "cannot reach " + std::to_string(bad.size()) + " of " + std::to_string(hosts) +
                     " host(s) over ssh, nothing was started: ";
  for (size_t i = 0; i < bad.size(); ++i) {
    if (i) line += "; ";
    line += bad[i].host + " (" + bad[i].why + ")";
  }
  return line;
}

}  // namespace ddprun::launcher
