#include "agent/process/log_dir.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "store/sys/log.hpp"
#include "store/sys/random.hpp"

namespace ddprun::agent {
namespace {

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    throw std::system_error(errno, std::generic_category(), "cannot create " + path);
  }
}

}  // namespace

RunLogDir::RunLogDir(const std::string& base, const std::string& run_id) {
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/ddprun_XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) {
      throw std::system_error(errno, std::generic_category(), "cannot create " + templ);
    }
    base_ = templ;
    temporary_ = true;
  } else {
    base_ = base;
    std::error_code ec;
    std::filesystem::create_directories(base_, ec);
    if (ec) throw std::system_error(ec, "cannot create " + base_);
  }
  for (int tries = 0;; ++tries) {
    path_ = base_ + "/" + run_id + "_" + sys::random_suffix();
    if (::mkdir(path_.c_str(), 0755) == 0) break;
    if (errno != EEXIST || tries > 100) {
      throw std::system_error(errno, std::generic_category(), "cannot create " + path_);
    }
  }
}

std::string RunLogDir::make_attempt(int restart_count, int local_world_size) const {
  // A multi-node round re-formed without spending a restart (a node joined or left) keeps
  // the restart count: its logs go to attempt_<N>.<k> so nothing is overwritten.
  std::string attempt = path_ + "/attempt_" + std::to_string(restart_count);
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0 && errno == ENOENT) {
    // A tmp cleaner or a person removed it while the job ran: the job goes on, logging anew.
    std::error_code ec;
    std::filesystem::create_directories(path_, ec);
    if (temporary_) ::chmod(base_.c_str(), 0700);
    sys::log_line("warning: the log directory " + path_ +
                  " was removed while the job ran: recreated it (the earlier attempts' logs are "
                  "gone)");
  }
  for (int k = 1; ::mkdir(attempt.c_str(), 0755) != 0; ++k) {
    if (errno != EEXIST) {
      throw std::system_error(errno, std::generic_category(), "cannot create " + attempt);
    }
    attempt = path_ + "/attempt_" + std::to_string(restart_count) + "." + std::to_string(k);
  }
  for (int r = 0; r < local_world_size; ++r) make_dir(attempt + "/" + std::to_string(r));
  make_dir(flight_recorder_dir(attempt));
  return attempt;
}

std::string flight_recorder_dir(const std::string& attempt_dir) {
  return attempt_dir + "/flight_recorder";
}

std::string recovery_dir(const std::string& attempt_dir) {
  return attempt_dir + "/recovery";
}

void RunLogDir::remove_temporary() {
  if (!temporary_) return;
  std::error_code ec;
  std::filesystem::remove_all(base_, ec);
  temporary_ = false;
}

}  // namespace ddprun::agent
