// Durations as a person reads them in a message: "2 s", "0.5 s", "0.125 s".
#pragma once

#include <chrono>
#include <string>

namespace ddprun::sys {

inline std::string seconds_text(std::chrono::milliseconds d) {
  auto ms = d.count();
  std::string s = std::to_string(ms / 1000);
  if (ms % 1000 != 0) {
    std::string frac = std::to_string(1000 + ms % 1000).substr(1);  // 3 digits
    while (frac.back() == '0') frac.pop_back();
    s += "." + frac;
  }
  return s + " s";
}

}  // namespace ddprun::sys
