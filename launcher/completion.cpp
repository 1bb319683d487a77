#include <string>
#include <string_view>
#include <vector>

#include "launcher/flags.hpp"
#include "launcher/usage.hpp"

namespace ddprun::launcher {
namespace {

// The words a value may be, when the metavar lists them ("spawn|fork|forkserver"); none when
// it names a kind of value ("N", "HOST[:PORT]", "SECONDS").
std::vector<std::string> value_words(const Flag& f) {
  std::vector<std::string> out;
  if (f.name == "rdzv_backend") return {"static", "c10d", "etcd", "etcd-v2", "etcd-v3"};
  std::string_view m = f.metavar;
  while (!m.empty()) {
    const size_t bar = m.find('|');
    std::string_view word = m.substr(0, bar);
    bool plain = !word.empty();
    for (char ch : word) plain = plain && ((ch >= 'a' && ch <= 'z') || ch == '-');
    if (plain) out.emplace_back(word);
    if (bar == std::string_view::npos) break;
    m.remove_prefix(bar + 1);
  }
  return out;
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

std::string all_spellings() {
  std::vector<std::string> words;
  for (const Flag& f : flag_table()) {
    words.push_back(dashed(f.name));
    if (f.short_name) words.push_back(std::string("-") + f.short_name);
  }
  return joined(words);
}

std::string bash() {
  std::string cases;
  for (const Flag& f : flag_table()) {
    auto words = value_words(f);
    if (!f.takes_value || words.empty()) continue;
    std::string underscored = "--" + std::string(f.name);
    cases += "    " + dashed(f.name) + "|" + underscored + ") COMPREPLY=($(compgen -W \"" +
             joined(words) + "\" -- \"$cur\")); return;;\n";
  }
  return "# ddprun completion for bash: source <(ddprun --print-completion bash)\n"
         "_ddprun() {\n"
         "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
         "  case \"$prev\" in\n" +
         cases +
         "  esac\n"
         "  if [[ \"$cur\" == -* ]]; then\n"
         "    COMPREPLY=($(compgen -W \"" +
         all_spellings() +
         "\" -- \"$cur\"))\n"
         "    return\n"
         "  fi\n"
         "  COMPREPLY=($(compgen -f -- \"$cur\"))\n"
         "}\n"
         "complete -o default -F _ddprun ddprun\n";
}

std::string zsh_quoted(std::string_view text) {
  std::string out;
  for (char ch : text) {
    if (ch == '\'') {
      out += "'\\''";
    } else if (ch == '[' || ch == ']' || ch == ':') {
      out += '\\';
      out += ch;
    } else {
      out += ch;
    }
  }
  return out;
}

std::string zsh() {
  std::string specs;
  for (const Flag& f : flag_table()) {
    std::string help = zsh_quoted(f.help.substr(0, f.help.find(';')));
    std::string spec = "'" + dashed(f.name) + (f.takes_value ? "=" : "") + "[" + help + "]";
    if (f.takes_value) {
      auto words = value_words(f);
      spec += ":" + zsh_quoted(f.metavar) + ":" +
              (words.empty() ? "_files" : "(" + joined(words) + ")");
    }
    specs += "  " + spec + "' \\\n";
  }
  return "#compdef ddprun\n"
         "# ddprun completion for zsh: ddprun --print-completion zsh > ~/.zfunc/_ddprun\n"
         "_arguments -s \\\n" +
         specs + "  '*::entrypoint and its arguments:_files'\n";
}

std::string tcsh() {
  std::string values;
  for (const Flag& f : flag_table()) {
    auto words = value_words(f);
    if (!f.takes_value || words.empty()) continue;
    values += " 'n/" + dashed(f.name) + "/(" + joined(words) + ")/'";
  }
  std::string flags;
  for (const Flag& f : flag_table()) flags += (flags.empty() ? "" : " ") + dashed(f.name).substr(2);
  return "# ddprun completion for tcsh: eval \"`ddprun --print-completion tcsh`\"\n"
         "complete ddprun 'c/--/(" +
         flags + ")/'" + values + " 'p/*/f/'\n";
}

}  // namespace

std::string completion_script(std::string_view shell) {
  if (shell == "bash") return bash();
  if (shell == "zsh") return zsh();
  return tcsh();
}

}  // namespace ddprun::launcher
