#include "store/sys/dns_resolver.hpp"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "store/sys/fd.hpp"
#include "store/sys/log.hpp"
#include "store/sys/random.hpp"

namespace ddprun::sys::dns {
namespace {

constexpr size_t kMaxNameservers = 3;
constexpr uint16_t kDnsPort = 53;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool wanted(int family, const Address& a) {
  return family == AF_UNSPEC || family == a.family;
}

int option_value(const std::string& word, std::string_view key, int cap) {
  return std::min(cap, std::max(0, std::atoi(word.c_str() + key.size())));
}

// One name's A and/or AAAA records, asked of one server after another.
enum class Outcome { kFound, kNoName, kNoAnswer };
struct Answer {
  Outcome outcome = Outcome::kNoAnswer;
  std::vector<Address> addresses;
  std::string owner;
};

// Asks one server; kNoAnswer when it is silent, refuses or fails.
Answer ask_server(const Nameserver& server, const std::string& name, int family,
                  std::chrono::milliseconds timeout) {
  UniqueFd sock(::socket(server.addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  // Connected, so a closed port answers ECONNREFUSED at once instead of a timeout.
  if (!sock ||
      ::connect(sock.get(), reinterpret_cast<const sockaddr*>(&server.addr), server.len) != 0) {
    return {};
  }
  struct Pending {
    uint16_t id;
    uint16_t type;
    bool done = false;
  };
  std::vector<Pending> pending;
  for (uint16_t type : {kTypeA, kTypeAaaa}) {
    if (family != AF_UNSPEC && family != (type == kTypeA ? AF_INET : AF_INET6)) continue;
    uint16_t id = 0;
    random_bytes(reinterpret_cast<unsigned char*>(&id), sizeof id);
    std::vector<uint8_t> query = encode_query(id, name, type);
    if (::send(sock.get(), query.data(), query.size(), 0) < 0) return {};
    pending.push_back({id, type});
  }
  Answer answer;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  size_t open = pending.size();
  while (open > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return {};
    pollfd p{sock.get(), POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()) + 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return {};
    uint8_t buf[1232];  // larger answers come truncated, and we keep what fits
    ssize_t got = ::recv(sock.get(), buf, sizeof buf, 0);
    if (got < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return {};  // ECONNREFUSED: nothing listens there
    }
    auto response = decode_response(buf, static_cast<size_t>(got));
    if (!response) continue;  // garbage: keep waiting for the real answer
    auto it = std::find_if(pending.begin(), pending.end(),
                           [&](const Pending& q) { return q.id == response->id && !q.done; });
    if (it == pending.end()) continue;
    if (response->rcode == kRcodeNameError) return {Outcome::kNoName, {}, {}};
    if (response->rcode != kRcodeOk) return {};  // SERVFAIL, REFUSED: ask the next server
    it->done = true;
    --open;
    for (const Address& a : response->addresses) {
      if (a.family == (it->type == kTypeA ? AF_INET : AF_INET6)) answer.addresses.push_back(a);
    }
    if (answer.owner.empty()) answer.owner = response->owner;
  }
  // A before AAAA whatever order the answers came in.
  std::stable_sort(answer.addresses.begin(), answer.addresses.end(),
                   [](const Address& a, const Address& b) { return a.family < b.family; });
  answer.outcome = answer.addresses.empty() ? Outcome::kNoName : Outcome::kFound;
  return answer;
}

Answer ask(const std::string& name, int family, const Config& config) {
  std::vector<Nameserver> servers = config.nameservers;
  if (servers.empty()) {
    Nameserver local;
    auto* sin = reinterpret_cast<sockaddr_in*>(&local.addr);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(kDnsPort);
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    local.len = sizeof(sockaddr_in);
    servers.push_back(local);
  }
  for (int attempt = 0; attempt < std::max(1, config.attempts); ++attempt) {
    for (const Nameserver& server : servers) {
      Answer a = ask_server(server, name, family, config.timeout);
      if (a.outcome != Outcome::kNoAnswer) return a;
    }
  }
  return {};
}

// The names to ask, in order: as is first when it has at least ndots dots, else the search
// domains first; a trailing dot means exactly this name.
std::vector<std::string> candidates(const std::string& name, const Config& config) {
  if (name.back() == '.') return {name};
  std::vector<std::string> with_domains;
  for (const std::string& domain : config.search) with_domains.push_back(name + "." + domain);
  bool as_is_first = std::count(name.begin(), name.end(), '.') >= config.ndots;
  std::vector<std::string> out;
  if (as_is_first) out.push_back(name);
  out.insert(out.end(), with_domains.begin(), with_domains.end());
  if (!as_is_first) out.push_back(name);
  return out;
}

}  // namespace

Config parse_resolv_conf(std::string_view text) {
  Config config;
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    if (!(words >> key) || key[0] == '#' || key[0] == ';') continue;
    std::string word;
    if (key == "nameserver" && words >> word && config.nameservers.size() < kMaxNameservers) {
      auto literal = parse_literal(word);
      if (!literal) continue;
      Nameserver ns;
      if (literal->address.family == AF_INET) {
        auto* sin = reinterpret_cast<sockaddr_in*>(&ns.addr);
        sin->sin_family = AF_INET;
        sin->sin_port = htons(kDnsPort);
        std::memcpy(&sin->sin_addr, literal->address.bytes.data(), 4);
        ns.len = sizeof(sockaddr_in);
      } else {
        auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ns.addr);
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(kDnsPort);
        std::memcpy(&sin6->sin6_addr, literal->address.bytes.data(), 16);
        sin6->sin6_scope_id = literal->scope_id;
        ns.len = sizeof(sockaddr_in6);
      }
      config.nameservers.push_back(ns);
    } else if (key == "search" || key == "domain") {
      config.search.clear();
      while (words >> word && word[0] != '#' && word[0] != ';') {
        if (word.back() == '.') word.pop_back();
        if (!word.empty()) config.search.push_back(word);
        if (key == "domain") break;
      }
    } else if (key == "options") {
      while (words >> word) {
        if (word.rfind("ndots:", 0) == 0) config.ndots = option_value(word, "ndots:", 15);
        if (word.rfind("timeout:", 0) == 0) {
          config.timeout = std::chrono::seconds(std::max(1, option_value(word, "timeout:", 30)));
        }
        if (word.rfind("attempts:", 0) == 0) {
          config.attempts = std::max(1, option_value(word, "attempts:", 5));
        }
      }
    }
  }
  return config;
}

Config system_config() {
  std::ifstream in("/etc/resolv.conf");
  std::stringstream text;
  text << in.rdbuf();
  Config config = parse_resolv_conf(text.str());
  size_t dot = host_name().find('.');
  if (config.search.empty() && dot != std::string::npos && dot + 1 < host_name().size()) {
    config.search.push_back(host_name().substr(dot + 1));
  }
  return config;
}

std::optional<Literal> parse_literal(const std::string& host) {
  Literal l;
  if (::inet_pton(AF_INET, host.c_str(), l.address.bytes.data()) == 1) {
    l.address.family = AF_INET;
    return l;
  }
  std::string addr = host;
  std::string scope;
  if (size_t pct = host.find('%'); pct != std::string::npos) {
    addr = host.substr(0, pct);
    scope = host.substr(pct + 1);
  }
  if (::inet_pton(AF_INET6, addr.c_str(), l.address.bytes.data()) != 1) return std::nullopt;
  l.address.family = AF_INET6;
  if (!scope.empty()) {
    l.scope_id = ::if_nametoindex(scope.c_str());
    if (l.scope_id == 0) {
      char* end = nullptr;
      unsigned long n = std::strtoul(scope.c_str(), &end, 10);
      if (*end != '\0') return std::nullopt;
      l.scope_id = static_cast<uint32_t>(n);
    }
  }
  return l;
}

Lookup lookup_hosts(const std::string& path, const std::string& name, int family) {
  Lookup out;
  out.error = EAI_NONAME;
  if (name.empty()) return out;
  std::ifstream in(path);
  const std::string wanted_name =
      lower(name.back() == '.' ? name.substr(0, name.size() - 1) : name);
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string addr, first, word;
    if (!(words >> addr >> first)) continue;
    bool match = lower(first) == wanted_name;
    while (!match && words >> word) match = lower(word) == wanted_name;
    if (!match) continue;
    auto literal = parse_literal(addr);
    if (!literal || !wanted(family, literal->address)) continue;
    if (std::find(out.addresses.begin(), out.addresses.end(), literal->address) ==
        out.addresses.end()) {
      out.addresses.push_back(literal->address);
    }
    if (out.canonical.empty()) out.canonical = first;
  }
  std::stable_sort(out.addresses.begin(), out.addresses.end(),
                   [](const Address& a, const Address& b) { return a.family < b.family; });
  if (!out.addresses.empty()) out.error = 0;
  return out;
}

Lookup lookup(const std::string& name, int family, const Config& config) {
  if (name.empty()) return {{}, {}, EAI_NONAME};
  Lookup hosts = lookup_hosts(config.hosts_path, name, family);
  if (!hosts.addresses.empty()) return hosts;
  if (!valid_name(name)) return {{}, {}, EAI_NONAME};
  // RFC 6761: localhost names are loopback, whatever a DNS server says.
  const std::string l = lower(name.back() == '.' ? name.substr(0, name.size() - 1) : name);
  if (l == "localhost" || (l.size() > 10 && l.ends_with(".localhost"))) {
    Lookup local;
    local.canonical = name;
    Address v4{AF_INET, {127, 0, 0, 1}};
    Address v6{AF_INET6, {}};
    v6.bytes[15] = 1;
    if (wanted(family, v4)) local.addresses.push_back(v4);
    if (wanted(family, v6)) local.addresses.push_back(v6);
    return local;
  }
  bool no_answer = false;
  for (const std::string& candidate : candidates(name, config)) {
    Answer a = ask(candidate, family, config);
    if (a.outcome == Outcome::kFound) {
      Lookup found;
      found.addresses = std::move(a.addresses);
      found.canonical = a.owner.empty() ? candidate : a.owner;
      if (found.canonical.back() == '.') found.canonical.pop_back();
      return found;
    }
    no_answer = no_answer || a.outcome == Outcome::kNoAnswer;
  }
  return {{}, {}, no_answer ? EAI_AGAIN : EAI_NONAME};
}

}  // namespace ddprun::sys::dns
