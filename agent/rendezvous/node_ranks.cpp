#include "agent/rendezvous/node_ranks.hpp"

#include <algorithm>
#include <charconv>
#include <numeric>

namespace ddprun::agent {
namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

}  // namespace

std::string encode(const NodeDesc& d) {
  return std::to_string(d.nproc) + " " + std::to_string(d.port) + " " + std::to_string(d.hint) +
         " " + d.addr + " " + d.id + " " + std::to_string(d.replica_port);
}

NodeDesc decode_node_desc(std::string_view text) {
  auto bad = [&](const char* why) -> std::invalid_argument {
    return std::invalid_argument("malformed node descriptor '" + std::string(text.substr(0, 200)) +
                                 "': " + why);
  };
  std::string_view rest = text;
  auto field = [&]() {
    size_t space = rest.find(' ');
    std::string_view f = rest.substr(0, space);
    rest = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
    return f;
  };
  auto number = [&](std::string_view f, int& out) {
    auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), out);
    if (ec != std::errc() || end != f.data() + f.size()) throw bad("not a number");
  };
  NodeDesc d;
  number(field(), d.nproc);
  number(field(), d.port);
  number(field(), d.hint);
  d.addr = std::string(field());
  d.id = std::string(field());
  if (!rest.empty()) number(field(), d.replica_port);
  if (d.nproc < 1 || d.addr.empty() || d.id.empty() || !rest.empty()) throw bad("bad fields");
  return d;
}

int natural_compare(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      while (i < a.size() && a[i] == '0') ++i;
      while (j < b.size() && b[j] == '0') ++j;
      size_t si = i, sj = j;
      while (i < a.size() && is_digit(a[i])) ++i;
      while (j < b.size() && is_digit(b[j])) ++j;
      size_t li = i - si, lj = j - sj;
      if (li != lj) return li < lj ? -1 : 1;
      int c = a.substr(si, li).compare(b.substr(sj, lj));
      if (c != 0) return c;
      continue;
    }
    if (a[i] != b[j])
      return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]) ? -1 : 1;
    ++i;
    ++j;
  }
  if (i < a.size()) return 1;
  if (j < b.size()) return -1;
  // Equal up to leading zeros ("node01" vs "node1"): fall back to the bytes.
  int c = a.compare(b);
  return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

NodeRanks assign_node_ranks(const std::vector<NodeDesc>& nodes, bool strict) {
  const int n = static_cast<int>(nodes.size());
  NodeRanks out;
  out.node_rank.assign(n, -1);
  std::vector<int> owner(n, -1);  // node rank -> join index
  for (int i = 0; i < n; ++i) {
    int h = nodes[i].hint;
    if (h >= 0 && h < n && owner[h] < 0) {
      owner[h] = i;
      out.node_rank[i] = h;
    } else if (strict) {
      if (h < 0 || h >= n) {
        throw std::invalid_argument("node " + nodes[i].addr + " has --node-rank=" +
                                    std::to_string(h) + ", outside 0.." + std::to_string(n - 1));
      }
      throw std::invalid_argument("two nodes give --node-rank=" + std::to_string(h) + ": " +
                                  nodes[owner[h]].addr + " and " + nodes[i].addr);
    }
  }
  std::vector<int> rest;
  for (int i = 0; i < n; ++i) {
    if (out.node_rank[i] < 0) rest.push_back(i);
  }
  std::stable_sort(rest.begin(), rest.end(),
                   [&](int x, int y) { return natural_compare(nodes[x].addr, nodes[y].addr) < 0; });
  int next = 0;
  for (int i : rest) {
    while (owner[next] >= 0) ++next;
    owner[next] = i;
    out.node_rank[i] = next;
  }
  out.base_rank.assign(n, 0);
  int sum = 0;
  for (int r = 0; r < n; ++r) {
    out.base_rank[owner[r]] = sum;
    sum += nodes[owner[r]].nproc;
  }
  out.world_size = sum;
  out.rank0_index = n > 0 ? owner[0] : 0;
  return out;
}

}  // namespace ddprun::agent
