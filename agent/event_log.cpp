#include "agent/event_log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <system_error>

#include "store/sys/log.hpp"

namespace ddprun::agent {

EventLog::EventLog(const std::string& path, std::string job_id)
    : job_id_(std::move(job_id)), path_(path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw std::system_error(errno, std::generic_category(), "cannot open the event log " + path);
  }
  fd_.reset(fd);
}

void EventLog::emit(const char* event, nlohmann::json fields) {
  if (!fd_) return;
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  nlohmann::json line = {
      {"time", std::chrono::duration<double>(now).count()},
      {"job", job_id_},
      {"host", sys::host_name()},
      {"agent_pid", ::getpid()},
      {"event", event},
  };
  line.update(fields);
  // Invalid UTF-8 (a worker's output in a reason) is replaced, never thrown.
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (!sys::write_all(fd_.get(), text.data(), text.size())) {
    sys::log_line("warning: cannot write the event log " + path_ + ": no more events are logged");
    fd_.reset();
  }
}

}  // namespace ddprun::agent
