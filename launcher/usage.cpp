#include "launcher/usage.hpp"

#include <string_view>

#include "launcher/flags.hpp"

#ifndef DDPRUN_VERSION
#define DDPRUN_VERSION "0.0.0"
#endif

namespace ddprun::launcher {
namespace {

constexpr size_t kColumn = 34;
constexpr size_t kWidth = 100;

// Appends `text` word-wrapped to kWidth, continuation lines indented to kColumn.
void append_wrapped(std::string& out, size_t used, std::string_view text) {
  while (!text.empty()) {
    size_t room = kWidth - used;
    size_t cut = text.size();
    if (cut > room) {
      cut = text.rfind(' ', room);
      if (cut == std::string_view::npos || cut == 0) cut = room;
    }
    out.append(text.substr(0, cut));
    out += '\n';
    text.remove_prefix(cut);
    while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
    if (!text.empty()) out.append(kColumn, ' ');
    used = kColumn;
  }
}

}  // namespace

std::string default_text(const Flag& f) {
  std::string out;
  if (!f.env.empty()) out += "$" + std::string(f.env);
  if (!f.default_value.empty())
    out += (out.empty() ? "" : ", else ") + std::string(f.default_value);
  return out.empty() ? out : " (default " + out + ")";
}

namespace {

// One flag's lines in --help: its spellings, then its help wrapped at kColumn.
void append_flag_help(std::string& out, const Flag& f) {
  std::string spell = "  ";
  if (f.short_name) {
    spell += '-';
    spell += f.short_name;
    spell += ", ";
  }
  spell += dashed(f.name);
  if (f.takes_value) {
    spell += ' ';
    spell += f.metavar;
  }
  if (spell.size() + 1 < kColumn) {
    spell.resize(kColumn, ' ');
  } else {
    spell += "\n" + std::string(kColumn, ' ');
  }
  out += spell;
  append_wrapped(out, kColumn, std::string(f.help) + default_text(f));
}

}  // namespace

std::string usage_line() {
  return "usage: ddprun [OPTIONS] (SCRIPT.py | -m MODULE | PROGRAM) [ARGS...]  "
         "(ddprun --help lists the options)\n";
}

std::string version_text() {
  return std::string("ddprun ") + DDPRUN_VERSION + "\n";
}

std::string help_text() {
  std::string out =
      "usage: ddprun [OPTIONS] (SCRIPT.py | -m MODULE | PROGRAM) [ARGS...]\n"
      "\n"
      "Starts --nproc-per-node copies of a training program on this machine with the\n"
      "environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,\n"
      "MASTER_PORT, ...), hosts their c10d store, restarts the whole group when a worker\n"
      "fails (up to --max-restarts times), forwards signals, and never leaves a process\n"
      "behind. Replace `torchrun` by `ddprun` in a launch line: the flags are the same.\n"
      "\n"
      "Several nodes: run ddprun on each. Static: --nnodes=N --node-rank=I --master-addr=H\n"
      "--master-port=P (node 0 hosts the store). Elastic: --nnodes=MIN:MAX\n"
      "--rdzv-backend=c10d --rdzv-endpoint=H:P --rdzv-id=JOB, the store hosted by the agent\n"
      "on H or by a separately started `ddpstore`; nodes may join and leave while the job\n"
      "runs (a lost node is noticed at once, the others re-form if MIN remain).\n"
      "Or start every node from here over ssh: --hosts a,b,c or --hostfile FILE (below).\n"
      "\n"
      "The entrypoint: SCRIPT.py runs as `$PYTHON_EXEC -u SCRIPT.py` (python3 when PYTHON_EXEC\n"
      "is unset); -m MODULE as `python3 -u -m MODULE`; any other executable (./train, or a\n"
      "name on PATH) is exec'd directly, as with --no-python. Everything after it is passed\n"
      "to every worker unchanged, with ${local_rank} replaced by the worker's local rank.\n";
  static const std::pair<std::string_view, std::string_view> groups[] = {
      {"general", "General"}, {"nodes", "Nodes and workers"},         {"rendezvous", "Rendezvous"},
      {"workers", "Workers"}, {"health", "Hangs, health and events"}, {"entrypoint", "Entrypoint"},
      {"logs", "Logs"},       {"ssh", "Several nodes over ssh"}};
  for (const auto& [key, title] : groups) {
    out += "\n";
    out += title;
    out += ":\n";
    for (const Flag& f : flag_table()) {
      if (f.group == key) append_flag_help(out, f);
    }
  }
  out +=
      "\n"
      "Every flag can be spelled with dashes or underscores (--nproc-per-node,\n"
      "--nproc_per_node), as --flag=value or --flag value, and defaults to the environment\n"
      "variable PET_<FLAG> (PET_NPROC_PER_NODE=4; switches read PET_STANDALONE=1).\n"
      "Inside a Slurm step (srun), what Slurm's variables imply fills in --nnodes,\n"
      "--node-rank, --master-addr, --master-port and --rdzv-id that neither sets.\n"
      "\n"
      "Exit status: 0 when every worker exited 0; the root-cause worker's exit code when the\n"
      "job failed (128 + N if signal N killed it, 127 if it could not be executed; torchrun\n"
      "always exits 1); 124 when the root cause was a hung worker; 1 when the rendezvous\n"
      "failed, the store was lost, the workers could not start or the job failed on another\n"
      "node; 128 + N when ddprun itself got signal N; 2 for bad arguments (nothing is\n"
      "started).\n";
  return out;
}

namespace {

std::string md_cell(std::string_view text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

}  // namespace

std::string flag_table_markdown() {
  std::string out = "| flag | default | what |\n|---|---|---|\n";
  for (const Flag& f : flag_table()) {
    std::string spell = "`";
    if (f.short_name) spell += std::string("-") + f.short_name + "`, `";
    spell += dashed(f.name);
    if (f.takes_value) spell += " " + std::string(f.metavar);
    spell += "`";
    std::string def;
    if (!f.env.empty()) def += "`$" + std::string(f.env) + "`";
    if (!f.default_value.empty()) {
      def += (def.empty() ? "`" : ", else `") + std::string(f.default_value) + "`";
    }
    if (def.empty()) def = f.takes_value ? "none" : "off";
    out += "| " + md_cell(spell) + " | " + md_cell(def) + " | " + md_cell(f.help) + " |\n";
  }
  return out;
}

}  // namespace ddprun::launcher
