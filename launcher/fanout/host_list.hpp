// The hosts of a launch over ssh, in node-rank order: from `--hosts a,b,c` or from a hostfile
// in DeepSpeed's format, and narrowed by `--include`/`--exclude` (DeepSpeed's syntax).
//
// Hostfile: one host per line, `HOST slots=N` (or a bare `HOST`: slots unknown), `#` starts a
// comment, blank lines are skipped, a host may appear once. Slots are the host's device
// indices 0..N-1.
//
// Filters: `NODE_SPEC[@NODE_SPEC...]`, NODE_SPEC = `HOST` (the whole host) or `HOST:S,S,...`
// (those slots). --include keeps only what it names; --exclude removes it (a host left with
// no slot is dropped). Hosts keep their hostfile order. The two are exclusive. Every error
// throws CliError with one line.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

struct HostEntry {
  std::string name;
  std::optional<int> slots;  // from `slots=N`; unknown for --hosts and bare hostfile lines
};

// `source` names the file in messages ("hosts.txt:3: ...").
std::vector<HostEntry> parse_hostfile(std::string_view text, const std::string& source);
std::vector<HostEntry> parse_host_list(std::string_view list);

// One node of the job after the filters.
struct NodeSlots {
  std::string host;
  std::optional<int> slots;  // how many workers the host offers, when known
  // Set when a filter named slots of this host: exactly these devices (CUDA_VISIBLE_DEVICES,
  // and as many workers).
  std::optional<std::vector<int>> devices;
};

std::vector<NodeSlots> apply_filters(const std::vector<HostEntry>& hosts, std::string_view include,
                                     std::string_view exclude);

}  // namespace ddprun::launcher
