#include "launcher/fanout/env_file.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ddprun::launcher {

bool valid_env_name(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  for (char c : name) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

void set_env(EnvList& env, const std::string& name, const std::string& value) {
  for (auto& [n, v] : env) {
    if (n == name) {
      v = value;
      return;
    }
  }
  env.emplace_back(name, value);
}

EnvList parse_env_file(std::string_view text, const std::string& source) {
  EnvList env;
  int line_no = 0;
  for (const auto& raw : split(text, '\n')) {
    ++line_no;
    std::string line = raw;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    std::string_view rest = std::string_view(line).substr(start);
    if (rest.starts_with("export ")) rest.remove_prefix(7);
    size_t eq = rest.find('=');
    std::string name(rest.substr(0, eq));
    if (eq == std::string_view::npos || !valid_env_name(name)) {
      throw CliError(source + ":" + std::to_string(line_no) + ": expected NAME=value, got '" +
                     line + "'");
    }
    set_env(env, name, std::string(rest.substr(eq + 1)));
  }
  return env;
}

std::optional<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return std::nullopt;
    throw CliError(path + ": " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

EnvList collect_exports(const std::vector<std::string>& exports, const GetEnv& getenv,
                        const ReadFile& read_file, const std::string& cwd,
                        std::vector<std::string>& notices) {
  EnvList env;
  std::vector<std::string> files;
  if (auto chosen = getenv("DDPRUN_ENV_FILE"); chosen && !chosen->empty()) {
    if (!read_file(*chosen)) throw CliError("DDPRUN_ENV_FILE=" + *chosen + ": no such file");
    files.push_back(*chosen);
  } else {
    if (auto home = getenv("HOME"); home && !home->empty()) files.push_back(*home + "/.ddprunenv");
    files.push_back(cwd + "/.ddprunenv");
  }
  for (const auto& path : files) {
    auto text = read_file(path);
    if (!text) continue;
    for (auto& [n, v] : parse_env_file(*text, path)) set_env(env, n, v);
    notices.push_back("sending the variables of " + path + " to every node");
  }
  for (const auto& item : exports) {
    size_t eq = item.find('=');
    std::string name = item.substr(0, eq);
    if (!valid_env_name(name)) {
      throw CliError("--export: '" + item + "' is not NAME or NAME=VALUE");
    }
    if (eq != std::string::npos) {
      set_env(env, name, item.substr(eq + 1));
    } else if (auto value = getenv(name)) {
      set_env(env, name, *value);
    } else {
      notices.push_back("--export: " + name + " is not set here; not sent");
    }
  }
  return env;
}

}  // namespace ddprun::launcher
