#include "launcher/fanout/shell_words.hpp"

#include "launcher/cli_parser.hpp"

namespace ddprun::launcher {
namespace {

bool plain(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.' || c == '/' || c == ',' || c == ':' || c == '+' || c == '@' ||
         c == '%';
}

}  // namespace

std::string shell_quote(std::string_view word) {
  bool bare = !word.empty();
  for (char c : word) bare = bare && plain(c);
  if (bare) return std::string(word);
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  out += '\'';
  return out;
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) {
    if (!out.empty()) out += ' ';
    out += shell_quote(w);
  }
  return out;
}

std::vector<std::string> split_shell_words(std::string_view text, const std::string& flag) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(cur));
      cur.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\\') {
      if (++i == text.size()) throw CliError(flag + ": a trailing backslash");
      cur += text[i];
    } else if (c == '\'') {
      size_t end = text.find('\'', i + 1);
      if (end == std::string_view::npos) throw CliError(flag + ": an unterminated ' quote");
      cur.append(text.substr(i + 1, end - i - 1));
      i = end;
    } else if (c == '"') {
      for (++i;; ++i) {
        if (i >= text.size()) throw CliError(flag + ": an unterminated \" quote");
        if (text[i] == '"') break;
        if (text[i] == '\\' && i + 1 < text.size() &&
            (text[i + 1] == '"' || text[i + 1] == '\\' || text[i + 1] == '$' ||
             text[i + 1] == '`')) {
          ++i;
        }
        cur += text[i];
      }
    } else {
      cur += c;
    }
  }
  if (in_word) words.push_back(std::move(cur));
  return words;
}

}  // namespace ddprun::launcher
