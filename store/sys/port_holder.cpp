#include "store/sys/port_holder.hpp"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

namespace ddprun::sys {
namespace {

constexpr size_t kMaxProcesses = 100000;
constexpr size_t kMaxCommand = 120;

// The inodes of sockets in LISTEN state (st 0A) on `port` in /proc/net/tcp or tcp6:
//   sl local_address:port rem_address:port st tx:rx tr:when retrnsmt uid timeout inode ...
void listening_inodes(const std::string& file, int port, std::set<std::string>& out) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    if (!(fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode)) {
      continue;
    }
    size_t colon = local.rfind(':');
    if (colon == std::string::npos || state != "0A") continue;
    if (std::strtol(local.c_str() + colon + 1, nullptr, 16) == port) out.insert(inode);
  }
}

std::string command_of(const std::string& proc, const std::string& pid) {
  std::ifstream in(proc + "/" + pid + "/cmdline");
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  for (char& c : raw) {
    if (c == '\0') c = ' ';
  }
  if (raw.size() > kMaxCommand) raw = raw.substr(0, kMaxCommand - 3) + "...";
  return raw;
}

}  // namespace

std::optional<PortHolder> find_port_holder(int port, const std::string& proc) {
  std::set<std::string> inodes;
  listening_inodes(proc + "/net/tcp", port, inodes);
  listening_inodes(proc + "/net/tcp6", port, inodes);
  inodes.erase("0");
  if (inodes.empty()) return std::nullopt;
  std::set<std::string> wanted;
  for (const auto& i : inodes) wanted.insert("socket:[" + i + "]");

  DIR* dir = ::opendir(proc.c_str());
  if (!dir) return PortHolder{};
  std::optional<PortHolder> found;
  size_t seen = 0;
  while (dirent* e = ::readdir(dir)) {
    if (found || ++seen > kMaxProcesses) break;
    std::string pid = e->d_name;
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string fds = proc + "/" + pid + "/fd";
    DIR* fd_dir = ::opendir(fds.c_str());
    if (!fd_dir) continue;  // another user's, or gone
    while (dirent* f = ::readdir(fd_dir)) {
      char target[64];
      ssize_t n = ::readlinkat(::dirfd(fd_dir), f->d_name, target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      if (wanted.count(target)) {
        found = PortHolder{static_cast<pid_t>(std::atoi(pid.c_str())), command_of(proc, pid)};
        break;
      }
    }
    ::closedir(fd_dir);
  }
  ::closedir(dir);
  return found ? found : PortHolder{};
}

std::string port_holder_text(int port) {
  auto holder = find_port_holder(port);
  if (!holder) return {};
  const std::string p = std::to_string(port);
  if (holder->pid == 0) return " (a process this user cannot see listens on port " + p + ")";
  return " (port " + p + " is held by pid " + std::to_string(holder->pid) +
         (holder->command.empty() ? std::string() : ": " + holder->command) + ")";
}

}  // namespace ddprun::sys
