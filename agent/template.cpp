#include "agent/template.hpp"

namespace ddprun::agent {
namespace {

bool id_start(char c) {
  return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool id_char(char c) {
  return id_start(c) || (c >= '0' && c <= '9');
}

}  // namespace

std::string safe_substitute(std::string_view text,
                            const std::map<std::string, std::string>& values) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    char c = text[i];
    if (c != '$' || i + 1 >= text.size()) {
      out += c;
      ++i;
      continue;
    }
    char next = text[i + 1];
    if (next == '$') {  // escaped delimiter
      out += '$';
      i += 2;
      continue;
    }
    if (id_start(next)) {  // $name
      size_t end = i + 2;
      while (end < text.size() && id_char(text[end])) ++end;
      std::string name(text.substr(i + 1, end - i - 1));
      auto it = values.find(name);
      out += it != values.end() ? it->second : std::string(text.substr(i, end - i));
      i = end;
      continue;
    }
    if (next == '{' && i + 2 < text.size() && id_start(text[i + 2])) {  // ${name}
      size_t end = i + 3;
      while (end < text.size() && id_char(text[end])) ++end;
      if (end < text.size() && text[end] == '}') {
        std::string name(text.substr(i + 2, end - i - 2));
        auto it = values.find(name);
        out += it != values.end() ? it->second : std::string(text.substr(i, end + 1 - i));
        i = end + 1;
        continue;
      }
    }
    out += '$';  // an invalid placeholder stays as it is
    ++i;
  }
  return out;
}

}  // namespace ddprun::agent
