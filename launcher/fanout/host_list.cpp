#include "launcher/fanout/host_list.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "launcher/cli_parser.hpp"

namespace ddprun::launcher {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

// A host name reaches ssh's command line and the remote ones: no option look-alikes, no
// blanks, no characters the filter syntax uses.
void check_host(std::string_view host, const std::string& where) {
  if (host.empty()) throw CliError(where + "an empty host name");
  if (host.front() == '-')
    throw CliError(where + "a host name cannot start with '-': " + std::string(host));
  for (char c : host) {
    if (c == '@' || c == ',' || c == '=' || c == '#' || static_cast<unsigned char>(c) <= ' ') {
      throw CliError(where + "bad host name '" + std::string(host) + "'");
    }
  }
}

void add_unique(std::vector<HostEntry>& out, HostEntry e, const std::string& where) {
  for (const auto& h : out) {
    if (h.name == e.name) throw CliError(where + "host " + e.name + " is listed twice");
  }
  out.push_back(std::move(e));
}

std::optional<int> parse_slots(std::string_view word) {
  if (!word.starts_with("slots=")) return std::nullopt;
  auto n = parse_int(word.substr(6));
  if (!n || *n < 1 || *n > 65536) return std::nullopt;
  return static_cast<int>(*n);
}

}  // namespace

std::vector<HostEntry> parse_hostfile(std::string_view text, const std::string& source) {
  std::vector<HostEntry> out;
  int line_no = 0;
  for (const auto& raw : split(text, '\n')) {
    ++line_no;
    std::string_view line = raw;
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::string where = source + ":" + std::to_string(line_no) + ": ";
    size_t blank = line.find_first_of(" \t");
    HostEntry e{std::string(line.substr(0, blank)), std::nullopt};
    check_host(e.name, where);
    if (blank != std::string_view::npos) {
      std::string_view rest = trim(line.substr(blank));
      e.slots = parse_slots(rest);
      if (!e.slots) {
        throw CliError(where + "expected 'HOST slots=N' (N >= 1), got '" + std::string(line) + "'");
      }
    }
    add_unique(out, std::move(e), where);
  }
  if (out.empty()) throw CliError(source + ": no hosts in the hostfile");
  return out;
}

std::vector<HostEntry> parse_host_list(std::string_view list) {
  std::vector<HostEntry> out;
  for (const auto& item : split(list, ',')) {
    std::string_view host = trim(item);
    check_host(host, "--hosts: ");
    add_unique(out, HostEntry{std::string(host), std::nullopt}, "--hosts: ");
  }
  return out;
}

namespace {

// NODE_SPEC@NODE_SPEC... -> host -> slots (empty: the whole host), in the order written.
std::vector<std::pair<std::string, std::vector<int>>> parse_filter(std::string_view text,
                                                                   const std::string& flag) {
  std::vector<std::pair<std::string, std::vector<int>>> out;
  for (const auto& spec : split(text, '@')) {
    const std::string where = flag + "=" + std::string(text) + ": ";
    size_t colon = spec.find(':');
    std::string host = spec.substr(0, colon);
    if (host.empty()) throw CliError(where + "expected HOST[:SLOT,...][@HOST...]");
    std::vector<int> slots;
    if (colon != std::string::npos) {
      for (const auto& s : split(std::string_view(spec).substr(colon + 1), ',')) {
        auto n = parse_int(s);
        if (!n || *n < 0 || *n > 65535) {
          throw CliError(where + "'" + s + "' is not a slot number (HOST:0,2)");
        }
        slots.push_back(static_cast<int>(*n));
      }
    }
    out.emplace_back(std::move(host), std::move(slots));
  }
  return out;
}

std::vector<int> all_slots(const HostEntry& h) {
  std::vector<int> v;
  for (int i = 0; i < h.slots.value_or(0); ++i) v.push_back(i);
  return v;
}

const HostEntry& find_host(const std::vector<HostEntry>& hosts, const std::string& name,
                           const std::string& flag) {
  for (const auto& h : hosts) {
    if (h.name == name) return h;
  }
  throw CliError(flag + ": host '" + name + "' is not in the host list");
}

void check_slot(const HostEntry& h, int slot, const std::string& flag) {
  if (h.slots && slot >= *h.slots) {
    throw CliError(flag + ": host " + h.name + " has slots 0-" + std::to_string(*h.slots - 1) +
                   ", not " + std::to_string(slot));
  }
}

}  // namespace

std::vector<NodeSlots> apply_filters(const std::vector<HostEntry>& hosts, std::string_view include,
                                     std::string_view exclude) {
  if (!include.empty() && !exclude.empty()) {
    throw CliError("--include and --exclude cannot be used together");
  }
  // name -> devices (nullopt: the whole host)
  std::map<std::string, std::optional<std::set<int>>> kept;
  if (include.empty()) {
    for (const auto& h : hosts) kept[h.name] = std::nullopt;
  }
  if (!include.empty()) {
    std::set<std::string> whole;
    for (auto& [name, slots] : parse_filter(include, "--include")) {
      const HostEntry& h = find_host(hosts, name, "--include");
      if (slots.empty()) whole.insert(name);  // the whole host wins over a partial mention
      if (whole.count(name)) {
        kept[name] = std::nullopt;
        continue;
      }
      std::set<int> s = kept[name].value_or(std::set<int>{});
      for (int slot : slots) {
        check_slot(h, slot, "--include");
        s.insert(slot);
      }
      kept[name] = std::move(s);
    }
  }
  if (!exclude.empty()) {
    for (auto& [name, slots] : parse_filter(exclude, "--exclude")) {
      const HostEntry& h = find_host(hosts, name, "--exclude");
      if (slots.empty()) {
        kept.erase(name);
        continue;
      }
      if (!h.slots) {
        throw CliError("--exclude: host " + name +
                       " has no slots=N in the host list, so none can be excluded");
      }
      auto it = kept.find(name);
      if (it == kept.end()) continue;
      if (!it->second) {
        auto v = all_slots(h);
        it->second = std::set<int>(v.begin(), v.end());
      }
      for (int slot : slots) {
        check_slot(h, slot, "--exclude");
        it->second->erase(slot);
      }
      if (it->second->empty()) kept.erase(it);
    }
  }
  std::vector<NodeSlots> out;
  for (const auto& h : hosts) {
    auto it = kept.find(h.name);
    if (it == kept.end()) continue;
    NodeSlots n{h.name, h.slots, std::nullopt};
    if (it->second) n.devices = std::vector<int>(it->second->begin(), it->second->end());
    out.push_back(std::move(n));
  }
  if (out.empty()) throw CliError("--include/--exclude left no host to run on");
  return out;
}

}  // namespace ddprun::launcher
