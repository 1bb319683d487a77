#include "examples/train/options.hpp"

#include <charconv>
#include <string_view>

namespace train {

const char* const kUsage =
    "usage: train --steps N --global-batch B [--seed S] [--checkpoint DIR]\n"
    "             [--checkpoint-every K] [--memory-every K] [--log-every K] [--lr F]\n"
    "             [--dataset-size N]\n"
    "             [--features D] [--hidden H] [--classes C] [--backend auto|gloo|nccl]\n"
    "             [--device auto|cpu|cuda] [--compression none|fp16|bf16]\n"
    "             [--kill-rank-at-step RANK:STEP] [--timeline FILE] [--mark-every K]\n"
    "Trains an MLP classifier on a seeded synthetic dataset with ddprun's C++\n"
    "DistributedDataParallel; start it with ddprun (or torchrun) --no-python.\n";

namespace {

template <typename T>
T parse_number(std::string_view flag, std::string_view text, T min) {
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw UsageError(std::string(flag) + ": \"" + std::string(text) + "\" is not a valid number");
  }
  if (value < min) {
    throw UsageError(std::string(flag) + ": " + std::string(text) + " is below " +
                     std::to_string(min));
  }
  return value;
}

double parse_double(std::string_view flag, const std::string& text) {
  try {
    size_t used = 0;
    double v = std::stod(text, &used);
    if (used == text.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(std::string(flag) + ": \"" + text + "\" is not a positive number");
}

std::string one_of(std::string_view flag, const std::string& v,
                   std::initializer_list<const char*> allowed) {
  for (const char* a : allowed) {
    if (v == a) return v;
  }
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  throw UsageError(std::string(flag) + ": \"" + v + "\" is not one of " + list);
}

// One option's value into `o`; UsageError for an unknown option or a bad value.
void apply_option(Options& o, const std::string& arg, const std::string& value) {
  if (arg == "--steps") {
    o.steps = parse_number<int64_t>(arg, value, 1);
  } else if (arg == "--global-batch") {
    o.global_batch = parse_number<int64_t>(arg, value, 1);
  } else if (arg == "--seed") {
    o.seed = parse_number<uint64_t>(arg, value, 0);
  } else if (arg == "--checkpoint") {
    if (value.empty()) throw UsageError("--checkpoint needs a directory");
    o.checkpoint = value;
  } else if (arg == "--checkpoint-every") {
    o.checkpoint_every = parse_number<int64_t>(arg, value, 1);
  } else if (arg == "--memory-every") {
    o.memory_every = parse_number<int64_t>(arg, value, 0);
  } else if (arg == "--log-every") {
    o.log_every = parse_number<int64_t>(arg, value, 1);
  } else if (arg == "--lr") {
    o.lr = parse_double(arg, value);
  } else if (arg == "--dataset-size") {
    o.dataset_size = parse_number<int64_t>(arg, value, 1);
  } else if (arg == "--features") {
    o.features = parse_number<int64_t>(arg, value, 1);
  } else if (arg == "--hidden") {
    o.hidden = parse_number<int64_t>(arg, value, 1);
  } else if (arg == "--classes") {
    o.classes = parse_number<int64_t>(arg, value, 2);
  } else if (arg == "--backend") {
    o.backend = one_of(arg, value, {"auto", "gloo", "nccl"});
  } else if (arg == "--device") {
    o.device = one_of(arg, value, {"auto", "cpu", "cuda"});
  } else if (arg == "--compression") {
    o.compression = one_of(arg, value, {"none", "fp16", "bf16"});
  } else if (arg == "--kill-rank-at-step") {
    auto colon = value.find(':');
    if (colon == std::string::npos) throw UsageError(arg + ": expected RANK:STEP");
    o.kill_rank = parse_number<int>(arg, std::string_view(value).substr(0, colon), 0);
    o.kill_step = parse_number<int64_t>(arg, std::string_view(value).substr(colon + 1), 0);
  } else if (arg == "--timeline") {
    if (value.empty()) throw UsageError("--timeline needs a file");
    o.timeline = value;
  } else if (arg == "--mark-every") {
    o.mark_every = parse_number<int64_t>(arg, value, 0);
  } else {
    throw UsageError("unknown argument " + arg);
  }
}

}  // namespace

Options parse_options(int argc, const char* const* argv) {
  Options o;
  bool have_steps = false, have_batch = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool inline_value = false;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    for (auto& c : arg) {
      if (c == '_') c = '-';  // accept --global_batch as torchrun-style users type it
    }
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argc) throw UsageError(arg + " needs a value");
      value = argv[++i];
    }
    apply_option(o, arg, value);
    have_steps = have_steps || arg == "--steps";
    have_batch = have_batch || arg == "--global-batch";
  }
  if (o.help) return o;
  if (!have_steps) throw UsageError("--steps is required");
  if (!have_batch) throw UsageError("--global-batch is required");
  return o;
}

}  // namespace train
