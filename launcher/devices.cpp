#include "launcher/devices.hpp"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <string>

namespace ddprun::launcher {
namespace {

int count_entries(const char* dir, bool (*match)(const char*)) {
  DIR* d = ::opendir(dir);
  if (!d) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    if (match(e->d_name)) ++n;
  }
  ::closedir(d);
  return n;
}

bool not_dot(const char* name) {
  return name[0] != '.';
}

bool nvidia_device_node(const char* name) {
  if (std::string_view(name).substr(0, 6) != "nvidia") return false;
  const char* p = name + 6;
  if (!*p) return false;
  for (; *p; ++p) {
    if (!std::isdigit(static_cast<unsigned char>(*p))) return false;
  }
  return true;
}

}  // namespace

int visible_device_entries(const std::string& value) {
  int n = 0;
  for (auto item : split(value, ',')) {
    item.erase(0, item.find_first_not_of(' '));
    if (item.empty()) break;
    bool numeric = std::all_of(item.begin(), item.end(),
                               [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    bool uuid = item.starts_with("GPU-") || item.starts_with("MIG-");
    if (!numeric && !uuid) break;  // CUDA stops at the first invalid entry (e.g. -1)
    ++n;
  }
  return n;
}

int cuda_device_count(const GetEnv& getenv) {
  int physical = count_entries("/proc/driver/nvidia/gpus", not_dot);
  if (physical < 0) physical = std::max(0, count_entries("/dev", nvidia_device_node));
  if (auto visible = getenv("CUDA_VISIBLE_DEVICES")) {
    return std::min(physical, visible_device_entries(*visible));
  }
  return physical;
}

int usable_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace ddprun::launcher
