// Test tool: for each stdin line "size world rank seed epoch shuffle drop_last", prints the
// indices ddprun::DistributedSampler yields, space-separated, one line per query.
#include <iostream>
#include <sstream>
#include <string>

#include "ddprun/sampler.hpp"

int main() {
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::istringstream in(line);
    int64_t size, epoch;
    int world, rank, shuffle, drop_last;
    uint64_t seed;
    in >> size >> world >> rank >> seed >> epoch >> shuffle >> drop_last;
    ddprun::DistributedSampler s(size, world, rank,
                                 ddprun::SamplerOptions{shuffle != 0, seed, drop_last != 0});
    s.set_epoch(epoch);
    const auto idx = s.indices();
    std::string out;
    for (size_t i = 0; i < idx.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(idx[i]);
    }
    std::cout << out << '\n';
  }
  return 0;
}
