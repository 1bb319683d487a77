// Which of a worker's standard streams go to log files (-r/--redirects) or to log files and
// the console (-t/--tee), in torchrun's notation: 0 none, 1 stdout, 2 stderr, 3 both, or a
// per-local-rank map "0:1,1:2" (ranks missing from the map: none).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string_view>

namespace ddprun::agent {

enum class Std : uint8_t { kNone = 0, kOut = 1, kErr = 2, kAll = 3 };

inline bool has(Std value, Std bit) {
  return (static_cast<uint8_t>(value) & static_cast<uint8_t>(bit)) != 0;
}
inline Std operator|(Std a, Std b) {
  return static_cast<Std>(static_cast<uint8_t>(a) | static_cast<uint8_t>(b));
}

class StdSpec {
 public:
  StdSpec() = default;
  explicit StdSpec(Std all) : all_(all) {}
  explicit StdSpec(std::map<int, Std> per_rank)
      : all_(std::nullopt), per_rank_(std::move(per_rank)) {}

  // "0".."3" or "r:v,r:v" (ranks are non-negative integers, values 0..3); nullopt otherwise.
  static std::optional<StdSpec> parse(std::string_view text);

  Std for_rank(int local_rank) const;
  bool is_map() const { return !all_.has_value(); }

 private:
  std::optional<Std> all_ = Std::kNone;
  std::map<int, Std> per_rank_;
};

}  // namespace ddprun::agent
