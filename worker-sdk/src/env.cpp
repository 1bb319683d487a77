#include "ddprun/env.hpp"

#include <charconv>
#include <cstdlib>

namespace ddprun {
namespace {

constexpr const char* kHint =
    " (start the program with ddprun or torchrun, which set RANK, WORLD_SIZE, LOCAL_RANK, "
    "MASTER_ADDR and MASTER_PORT)";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

class Reader {
 public:
  explicit Reader(const EnvLookup& lookup) : lookup_(lookup) {}

  std::optional<std::string> get(std::string_view name) const {
    if (lookup_) return lookup_(name);
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  }

  std::string required_string(std::string_view name) const {
    auto v = get(name);
    if (!v) throw Error("environment variable " + std::string(name) + " is not set" + kHint);
    if (trim(*v).empty()) {
      throw Error("environment variable " + std::string(name) + " is empty" + kHint);
    }
    return std::string(trim(*v));
  }

  int required_int(std::string_view name, int min, int max) const {
    return parse(name, required_string(name), min, max);
  }

  int optional_int(std::string_view name, int fallback, int min, int max) const {
    auto v = get(name);
    if (!v || trim(*v).empty()) return fallback;
    return parse(name, *v, min, max);
  }

 private:
  static int parse(std::string_view name, std::string_view raw, int min, int max) {
    std::string_view s = trim(raw);
    long long value = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size()) {
      throw Error("environment variable " + std::string(name) + "=\"" + std::string(raw) +
                  "\" is not an integer");
    }
    if (value < min || value > max) {
      throw Error("environment variable " + std::string(name) + "=" + std::string(s) +
                  " is out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]");
    }
    return static_cast<int>(value);
  }

  const EnvLookup& lookup_;
};

}  // namespace

WorkerEnv read_worker_env(const EnvLookup& lookup) {
  constexpr int kMaxInt = 1 << 30;
  Reader env(lookup);
  WorkerEnv w;
  w.world_size = env.required_int("WORLD_SIZE", 1, kMaxInt);
  w.rank = env.required_int("RANK", 0, kMaxInt);
  if (w.rank >= w.world_size) {
    throw Error("environment variable RANK=" + std::to_string(w.rank) +
                " is not below WORLD_SIZE=" + std::to_string(w.world_size));
  }
  w.local_world_size = env.optional_int("LOCAL_WORLD_SIZE", w.world_size, 1, w.world_size);
  w.local_rank = env.required_int("LOCAL_RANK", 0, kMaxInt);
  if (w.local_rank >= w.local_world_size) {
    throw Error("environment variable LOCAL_RANK=" + std::to_string(w.local_rank) +
                " is not below LOCAL_WORLD_SIZE=" + std::to_string(w.local_world_size));
  }
  w.group_rank = env.optional_int("GROUP_RANK", 0, 0, kMaxInt);
  w.master_addr = env.required_string("MASTER_ADDR");
  w.master_port = env.required_int("MASTER_PORT", 1, 65535);

  w.use_agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  if (w.use_agent_store && !env.get("TORCHELASTIC_RESTART_COUNT")) {
    throw Error(
        "environment variable TORCHELASTIC_RESTART_COUNT is not set, but "
        "TORCHELASTIC_USE_AGENT_STORE=True needs it to find this attempt's keys in the store");
  }
  w.restart_count = env.optional_int("TORCHELASTIC_RESTART_COUNT", 0, 0, kMaxInt);
  w.max_restarts = env.optional_int("TORCHELASTIC_MAX_RESTARTS", 0, 0, kMaxInt);
  w.run_id = env.get("TORCHELASTIC_RUN_ID").value_or("");
  w.error_file = env.get("TORCHELASTIC_ERROR_FILE").value_or("");
  return w;
}

}  // namespace ddprun
