#include "agent/process/std_streams.hpp"

#include <charconv>

namespace ddprun::agent {
namespace {

std::optional<Std> parse_value(std::string_view s) {
  if (s.size() != 1 || s[0] < '0' || s[0] > '3') return std::nullopt;
  return static_cast<Std>(s[0] - '0');
}

std::optional<int> parse_rank(std::string_view s) {
  int v = 0;
  if (s.empty()) return std::nullopt;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

}  // namespace

std::optional<StdSpec> StdSpec::parse(std::string_view text) {
  if (auto v = parse_value(text)) return StdSpec(*v);
  std::map<int, Std> map;
  while (true) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    size_t colon = item.find(':');
    if (colon == std::string_view::npos) return std::nullopt;
    auto rank = parse_rank(item.substr(0, colon));
    auto value = parse_value(item.substr(colon + 1));
    if (!rank || !value) return std::nullopt;
    map[*rank] = *value;
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return StdSpec(std::move(map));
}

Std StdSpec::for_rank(int local_rank) const {
  if (all_) return *all_;
  auto it = per_rank_.find(local_rank);
  return it == per_rank_.end() ? Std::kNone : it->second;
}

}  // namespace ddprun::agent
