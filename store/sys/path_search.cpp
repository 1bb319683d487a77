#include "store/sys/path_search.hpp"

#include <sys/stat.h>
#include <unistd.h>

namespace ddprun::sys {

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::optional<std::string> find_on_path(const std::string& name, std::string_view search_path,
                                        EmptyEntry empty) {
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos) {
    return is_executable_file(name) ? std::optional<std::string>(name) : std::nullopt;
  }
  for (;;) {
    const size_t colon = search_path.find(':');
    std::string dir(search_path.substr(0, colon));
    if (dir.empty() && empty == EmptyEntry::kCurrentDirectory) dir = ".";
    if (!dir.empty()) {
      std::string candidate = dir + "/" + name;
      if (is_executable_file(candidate)) return candidate;
    }
    if (colon == std::string_view::npos) return std::nullopt;
    search_path.remove_prefix(colon + 1);
  }
}

}  // namespace ddprun::sys
