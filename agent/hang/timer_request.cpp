#include "agent/hang/timer_request.hpp"

#include <climits>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>

namespace ddprun::agent {

namespace {

using nlohmann::json;

// The integer value of `field` if it is a JSON integer within [lo, hi].
std::optional<int64_t> integer_field(const json& request, const char* field, int64_t lo,
                                     int64_t hi) {
  auto it = request.find(field);
  if (it == request.end()) return std::nullopt;
  if (it->is_number_unsigned()) {
    uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(hi)) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (!it->is_number_integer()) return std::nullopt;
  int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return std::nullopt;
  return v;
}

ParsedTimerRequest error(std::string why) {
  return {std::nullopt, std::move(why)};
}

}  // namespace

ParsedTimerRequest parse_timer_request(std::string_view line) {
  json request = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded()) return error("not valid JSON");
  if (!request.is_object()) return error("not a JSON object");

  TimerRequest r;
  auto pid = integer_field(request, "pid", 1, INT_MAX);
  if (!pid) return error("'pid' is missing or not a positive integer");
  r.pid = static_cast<pid_t>(*pid);

  auto scope = request.find("scope_id");
  if (scope == request.end() || !scope->is_string()) {
    return error("'scope_id' is missing or not a string");
  }
  r.scope_id = scope->get<std::string>();

  auto expiration = request.find("expiration_time");
  if (expiration == request.end() || !expiration->is_number() ||
      !std::isfinite(expiration->get<double>())) {
    return error("'expiration_time' is missing or not a number");
  }
  r.expiration_time = expiration->get<double>();

  auto signal = integer_field(request, "signal", INT_MIN, INT_MAX);
  if (!signal) return error("'signal' is missing or not an integer");
  r.signal = static_cast<int>(*signal);
  return {std::move(r), {}};
}

}  // namespace ddprun::agent
