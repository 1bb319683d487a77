#include "launcher/flags.hpp"

#include <cctype>
#include <stdexcept>

namespace ddprun::launcher {

namespace {

std::string normalize(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c == '-') c = '_';
  }
  return out;
}

}  // namespace

const Flag* find_long_flag(std::string_view spelling, bool& ambiguous) {
  ambiguous = false;
  const std::string key = normalize(spelling);
  const Flag* prefix_match = nullptr;
  int prefix_matches = 0;
  for (const Flag& f : flag_table()) {
    if (f.name == key) return &f;
    if (!key.empty() && f.name.starts_with(key)) {
      prefix_match = &f;
      ++prefix_matches;
    }
  }
  if (prefix_matches == 1) return prefix_match;
  ambiguous = prefix_matches > 1;
  return nullptr;
}

const Flag& flag_named(std::string_view name) {
  for (const Flag& f : flag_table()) {
    if (f.name == name) return f;
  }
  throw std::logic_error("no flag named " + std::string(name));
}

const Flag* find_short_flag(char c) {
  for (const Flag& f : flag_table()) {
    if (f.short_name == c) return &f;
  }
  return nullptr;
}

std::string pet_variable(std::string_view name) {
  std::string out = "PET_";
  for (char c : name) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string dashed(std::string_view name) {
  std::string out = "--";
  for (char c : name) out += c == '_' ? '-' : c;
  return out;
}

}  // namespace ddprun::launcher
