#include "agent/warm_start.hpp"

#include <unistd.h>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdio>

#include "store/sys/log.hpp"

namespace ddprun::agent {
namespace {

constexpr int kMaxFailedZygotes = 3;

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

}  // namespace

WarmStart::WarmStart(const WorkerSpec& spec, std::string log_dir, std::vector<int> reset_signals,
                     Guardian* guardian)
    : spec_(spec),
      log_dir_(std::move(log_dir)),
      reset_signals_(std::move(reset_signals)),
      guardian_(guardian) {
  char buf[4096];
  if (::getcwd(buf, sizeof buf)) cwd_ = buf;
  start_zygote();
}

WarmStart::~WarmStart() = default;

void WarmStart::start_zygote() {
  if (zygote_) retired_.push_back(std::move(zygote_));
  announced_ = false;
  ZygoteOptions o;
  o.python = spec_.program;
  o.argv0 = spec_.argv0;
  size_t cmdline = spec_.argv0.size() + 1;
  for (const auto& a : spec_.args) cmdline += a.size() + 1;
  o.cmdline_room = 2 * cmdline + 1024;  // ${local_rank} and friends may grow an argument
  o.modules = spec_.warm_modules;
  o.env = spec_.base_env;
  o.reset_signals = reset_signals_;
  o.guardian = guardian_;
  o.log_path = log_dir_ + "/zygote" + (started_ ? "." + std::to_string(started_) : "") + ".log";
  ++started_;
  try {
    zygote_ = std::make_unique<Zygote>(std::move(o));
  } catch (const std::exception& e) {
    sys::log_line(std::string("warm start: cannot start a zygote (") + e.what() +
                  "); workers start cold");
    failed_in_a_row_ = kMaxFailedZygotes;
  }
}

bool WarmStart::usable() {
  if (!zygote_) return false;
  const std::optional<Zygote::Ready>& ready = zygote_->ready();  // what it said, no waiting
  if (zygote_->failed()) {
    ++failed_in_a_row_;
    const std::string why = zygote_->failure();
    if (failed_in_a_row_ >= kMaxFailedZygotes) {
      sys::log_line("warm start: the zygote failed (" + why + "), " +
                    std::to_string(failed_in_a_row_) +
                    " in a row: warm start is off for this job; workers start cold");
      retired_.push_back(std::move(zygote_));
      return false;
    }
    sys::log_line("warm start: the zygote failed (" + why +
                  "); workers start cold while a new one starts");
    start_zygote();
    return false;
  }
  if (!ready) {
    if (!cold_noted_)
      sys::log_line("warm start: the zygote is still importing; workers start cold");
    cold_noted_ = true;
    return false;
  }
  if (!announced_) {
    announced_ = true;
    char took[32], mem[32];
    std::snprintf(took, sizeof took, "%.1f", ready->import_s);
    std::snprintf(mem, sizeof mem, "%.0f", static_cast<double>(ready->rss_kb) / 1024);
    std::string line = "warm start: zygote (pid " + std::to_string(zygote_->pid()) + ") imported " +
                       (ready->modules.empty() ? "nothing" : joined(ready->modules)) + " in " +
                       took + " s (" + mem + " MB resident); workers are forked from it";
    if (!ready->missing.empty()) line += "; not importable: " + joined(ready->missing);
    if (ready->threads > 1) {
      line += "; note: it runs " + std::to_string(ready->threads) +
              " threads after importing (a library's thread pool), which fork does not copy";
    }
    sys::log_line(line);
  }
  return true;
}

bool WarmStart::settled() {
  return !zygote_ || zygote_->ready() || zygote_->failed();
}

boost::asio::awaitable<void> WarmStart::wait_until_settled(std::function<bool()> stop) {
  namespace asio = boost::asio;
  cold_noted_ = false;  // a new attempt
  if (settled()) co_return;
  const auto deadline = std::chrono::steady_clock::now() + kReadyWait;
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (!settled() && !stop()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      sys::log_line("warm start: the zygote (pid " + std::to_string(zygote_->pid()) +
                    ") has imported for " + std::to_string(kReadyWait.count()) +
                    " s and is not ready; this attempt starts cold");
      cold_noted_ = true;
      co_return;
    }
    timer.expires_after(std::chrono::milliseconds(5));
    co_await timer.async_wait(asio::use_awaitable);
  }
}

ProcessContext::WarmSpawn WarmStart::spawner() {
  retired_.clear();  // the previous attempt's processes are gone: nothing to reap through them
  return [this](const WorkerLaunch& launch, int out, int err) { return spawn(launch, out, err); };
}

std::optional<ChildProcess> WarmStart::spawn(const WorkerLaunch& launch, int stdout_fd,
                                             int stderr_fd) {
  if (!spec_.python || !usable()) return std::nullopt;
  const WorkerSpec::PythonEntry& py = *spec_.python;
  ZygoteSpawn req;
  req.module = py.module;
  req.target = launch.argv.at(py.target);
  req.args.assign(launch.argv.begin() + static_cast<long>(py.target) + 1, launch.argv.end());
  req.orig_argv = launch.argv;
  req.env = launch.env;
  req.cwd = cwd_;
  try {
    // An inherited stream is the agent's own, as for a cold worker (not the zygote's log).
    std::optional<ChildProcess> child(zygote_->spawn(req,
                                                     stdout_fd >= 0 ? stdout_fd : STDOUT_FILENO,
                                                     stderr_fd >= 0 ? stderr_fd : STDERR_FILENO));
    failed_in_a_row_ = 0;
    return child;
  } catch (const ZygoteError&) {
    usable();  // logs the failure and starts a replacement
    return std::nullopt;
  }
}

std::vector<pid_t> WarmStart::pids() const {
  std::vector<pid_t> out;
  if (zygote_ && zygote_->pid() > 0) out.push_back(zygote_->pid());
  for (const auto& z : retired_) {
    if (z && z->pid() > 0) out.push_back(z->pid());
  }
  return out;
}

}  // namespace ddprun::agent
