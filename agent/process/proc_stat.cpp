#include "agent/process/proc_stat.hpp"

#include <fstream>
#include <sstream>

namespace ddprun::agent {

std::vector<std::string> proc_stat_fields(pid_t pid) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/stat")
                            : "/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  std::vector<std::string> fields;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return fields;
  std::istringstream rest(line.substr(close + 1));
  std::string word;
  while (rest >> word) fields.push_back(std::move(word));
  return fields;
}

}  // namespace ddprun::agent
