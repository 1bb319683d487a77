#include "agent/process/process_context.hpp"

#include <fcntl.h>
#include <signal.h>

#include <chrono>
#include <system_error>
#include <utility>

#include "agent/process/guardian.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;

struct ProcessContext::Slot {
  WorkerLaunch launch;
  std::optional<ChildProcess> child;
  std::unique_ptr<asio::posix::stream_descriptor> pidfd;
  std::shared_ptr<StreamPump> out_pump;
  std::shared_ptr<StreamPump> err_pump;
  std::optional<WorkerExit> exit;
  std::string sigkill_why;  // ddprun sent it SIGKILL, for this reason
};

namespace {

// The parent's side of one stream: what the child gets as fd 1/2, and the pump if tee'd.
struct Wiring {
  sys::UniqueFd child_end;  // -1: inherit ddprun's fd
  std::shared_ptr<StreamPump> pump;
};

Wiring wire(asio::io_context& io, const StreamTarget& target) {
  Wiring w;
  switch (target.kind) {
    case StreamTarget::Kind::kInherit:
      break;
    case StreamTarget::Kind::kDevNull: {
      int fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
      if (fd < 0) throw std::system_error(errno, std::generic_category(), "open /dev/null");
      w.child_end = sys::UniqueFd(fd);
      break;
    }
    case StreamTarget::Kind::kFile:
      w.child_end = sys::open_for_write(target.path.c_str(), target.append);
      break;
    case StreamTarget::Kind::kTee: {
      sys::Pipe p = sys::make_pipe();
      PumpSinks sinks;
      sinks.file = sys::open_for_write(target.path.c_str(), target.append);
      sinks.file_path = target.path;
      sinks.console_fd = target.console_fd;
      sinks.prefix = target.prefix;
      sinks.filtered_file = target.filtered_file;
      sinks.filters = target.filters;
      w.pump = std::make_shared<StreamPump>(io, std::move(p.read), std::move(sinks));
      w.child_end = std::move(p.write);
      break;
    }
  }
  return w;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ProcessContext::ProcessContext(asio::io_context& io, Guardian* guardian, ExitCallback on_exit,
                               KillCauses* causes)
    : io_(io), guardian_(guardian), on_exit_(std::move(on_exit)), causes_(causes) {}

ProcessContext::~ProcessContext() {
  for (auto& slot : slots_) {
    if (slot->child && !slot->child->reaped()) {
      pid_t pid = slot->child->pid();
      slot->child.reset();  // SIGKILLs the group and reaps
      if (guardian_) guardian_->unwatch(pid);
    }
    if (slot->out_pump) slot->out_pump->finish();
    if (slot->err_pump) slot->err_pump->finish();
  }
}

void ProcessContext::start(const std::string& program, std::vector<WorkerLaunch> launches,
                           const std::vector<int>& reset_signals, const WarmSpawn& warm) {
  for (auto& launch : launches) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->launch = std::move(launch);
    spawn(slots_.size() - 1, program, reset_signals, warm);
  }
}

void ProcessContext::respawn(int local_rank, const std::string& program, WorkerLaunch launch,
                             const std::vector<int>& reset_signals, const WarmSpawn& ready) {
  const auto index = static_cast<size_t>(local_rank);
  Slot& old = *slots_.at(index);
  if (!old.exit) throw std::logic_error("respawn of a worker that has not exited");
  auto slot = std::make_unique<Slot>();
  slot->launch = std::move(launch);
  std::unique_ptr<Slot> dead = std::exchange(slots_[index], std::move(slot));
  try {
    spawn(index, program, reset_signals, ready);
  } catch (...) {
    slots_[index] = std::move(dead);  // the worker stays exited, as it was
    throw;
  }
}

void ProcessContext::spawn(size_t index, const std::string& program,
                           const std::vector<int>& reset_signals, const WarmSpawn& warm) {
  Slot& slot = *slots_[index];
  Wiring out = wire(io_, slot.launch.out);
  Wiring err = wire(io_, slot.launch.err);
  auto argv = c_array(slot.launch.argv);
  auto envp = c_array(slot.launch.env);
  SpawnRequest req;
  req.path = program.c_str();
  req.argv = argv.data();
  req.envp = envp.data();
  req.stdout_fd = out.child_end.get();
  req.stderr_fd = err.child_end.get();
  req.reset_signals = reset_signals;
  if (warm) {
    if (auto child = warm(slot.launch, req.stdout_fd, req.stderr_fd)) {
      slot.child.emplace(std::move(*child));
    }
  }
  if (slot.child) {
    ++warm_started_;
  } else {
    slot.child.emplace(ChildProcess::spawn(req));
  }
  if (guardian_) guardian_->watch(slot.child->pid());
  if (causes_) causes_->started(slot.child->pid());
  slot.pidfd =
      std::make_unique<asio::posix::stream_descriptor>(io_, slot.child->take_pidfd().release());
  slot.out_pump = std::move(out.pump);
  slot.err_pump = std::move(err.pump);
  if (slot.out_pump) slot.out_pump->start();
  if (slot.err_pump) slot.err_pump->start();
  watch_exit(index);
}

void ProcessContext::watch_exit(size_t index) {
  std::weak_ptr<char> alive = alive_;
  slots_[index]->pidfd->async_wait(
      asio::posix::stream_descriptor::wait_read,
      [this, index, alive](boost::system::error_code ec) {
        if (ec || alive.expired()) return;
        // A readiness of another descriptor's (see has_exited).
        if (!ChildProcess::has_exited(slots_[index]->pidfd->native_handle())) {
          watch_exit(index);
          return;
        }
        on_exit(index);
      });
}

void ProcessContext::on_exit(size_t index) {
  Slot& slot = *slots_[index];
  pid_t pid = slot.child->pid();
  ExitStatus status = slot.child->reap();
  if (guardian_) guardian_->unwatch(pid);
  if (slot.out_pump) slot.out_pump->finish();
  if (slot.err_pump) slot.err_pump->finish();
  boost::system::error_code ignored;
  slot.pidfd->close(ignored);
  slot.exit = WorkerExit{status, unix_now(), ++sequence_, slot.child->peak_rss_kb(), {}};
  if (causes_) {
    if (status.kind == ExitStatus::Kind::kSignaled && status.value == SIGKILL) {
      slot.exit->cause = causes_->explain(pid, slot.sigkill_why, slot.exit->peak_rss_kb);
    }
    causes_->forget(pid);
  }
  if (on_exit_) on_exit_(slot.launch.local_rank);
}

void ProcessContext::signal_all(int sig, const std::string& why) {
  for (auto& slot : slots_) {
    if (!slot->child || slot->child->reaped()) continue;
    if (sig == SIGKILL && slot->sigkill_why.empty()) {
      slot->sigkill_why = why.empty() ? "as it stopped the workers" : why;
    }
    slot->child->signal_group(sig);
  }
}

size_t ProcessContext::running() const {
  size_t n = 0;
  for (const auto& slot : slots_) n += slot->exit.has_value() ? 0 : 1;
  return n;
}

const std::optional<WorkerExit>& ProcessContext::exit_of(int local_rank) const {
  return slots_.at(static_cast<size_t>(local_rank))->exit;
}

pid_t ProcessContext::pid_of(int local_rank) const {
  const auto& slot = slots_.at(static_cast<size_t>(local_rank));
  return slot->child ? slot->child->pid() : -1;
}

const WorkerLaunch& ProcessContext::launch_of(int local_rank) const {
  return slots_.at(static_cast<size_t>(local_rank))->launch;
}

}  // namespace ddprun::agent
