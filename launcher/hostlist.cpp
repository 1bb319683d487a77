#include "launcher/hostlist.hpp"

#include <cctype>
#include <string>

namespace ddprun::launcher {
namespace {

// Numbers of more digits than this are refused: no host is named like that, and the values
// stay far from overflow.
constexpr std::size_t kMaxDigits = 18;

struct Range {
  unsigned long long lo = 0;
  unsigned long long hi = 0;
  std::size_t width = 0;  // the low end's digits, leading zeros included
};

// One piece of an entry: literal text, or the ranges of one bracket.
struct Segment {
  std::string text;
  std::vector<Range> ranges;  // empty: `text` is literal
  unsigned long long count() const {
    if (ranges.empty()) return 1;
    unsigned long long n = 0;
    for (const Range& r : ranges) n += r.hi - r.lo + 1;
    return n;
  }
};

bool all_digits(std::string_view s) {
  if (s.empty() || s.size() > kMaxDigits) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

unsigned long long to_number(std::string_view s) {
  unsigned long long v = 0;
  for (char c : s) v = v * 10 + static_cast<unsigned long long>(c - '0');
  return v;
}

// "1,3,5-7" (a bracket's body): its ranges, or an error.
std::string parse_bracket(std::string_view body, std::size_t max_hosts, Segment& out) {
  if (body.empty()) return "empty brackets '[]'";
  unsigned long long total = 0;
  while (true) {
    std::size_t comma = body.find(',');
    std::string_view item = body.substr(0, comma);
    std::size_t dash = item.find('-');
    std::string_view lo = item.substr(0, dash);
    std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi)) {
      return "'" + std::string(item) + "' is not a number or a range like 1-8";
    }
    Range r{to_number(lo), to_number(hi), lo.size()};
    if (r.lo > r.hi) return "reversed range '" + std::string(item) + "'";
    total += r.hi - r.lo + 1;
    if (total > max_hosts) return "more than " + std::to_string(max_hosts) + " hosts";
    out.ranges.push_back(r);
    if (comma == std::string_view::npos) return "";
    body.remove_prefix(comma + 1);
  }
}

// One entry ("rack[0-3]-n[01-16]") into segments; `hosts_after` is the expansion's size.
std::string parse_entry(std::string_view entry, std::size_t max_hosts,
                        std::vector<Segment>& segments, unsigned long long& hosts_after) {
  hosts_after = 1;
  while (!entry.empty()) {
    std::size_t open = entry.find('[');
    if (open != 0) {
      Segment literal{std::string(entry.substr(0, open)), {}};
      if (literal.text.find(']') != std::string::npos) return "unbalanced ']'";
      segments.push_back(std::move(literal));
      if (open == std::string_view::npos) break;
      entry.remove_prefix(open);
    }
    std::size_t close = entry.find(']');
    if (close == std::string_view::npos) return "unbalanced '['";
    std::string_view body = entry.substr(1, close - 1);
    if (body.find('[') != std::string_view::npos) return "nested '['";
    Segment bracket;
    if (std::string error = parse_bracket(body, max_hosts, bracket); !error.empty()) return error;
    hosts_after *= bracket.count();  // both factors <= max_hosts: no overflow
    if (hosts_after > max_hosts) return "more than " + std::to_string(max_hosts) + " hosts";
    segments.push_back(std::move(bracket));
    entry.remove_prefix(close + 1);
  }
  return "";
}

std::string format(unsigned long long v, std::size_t width) {
  std::string digits = std::to_string(v);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// The values of one bracket segment, in order.
std::vector<std::string> values(const Segment& s) {
  std::vector<std::string> out;
  for (const Range& r : s.ranges) {
    for (unsigned long long v = r.lo;; ++v) {
      out.push_back(format(v, r.width));
      if (v == r.hi) break;
    }
  }
  return out;
}

// The cartesian product, the first segment varying slowest (Slurm's order).
void expand(const std::vector<Segment>& segments, std::vector<std::string>& hosts) {
  std::vector<std::string> partial{""};
  for (const Segment& s : segments) {
    std::vector<std::string> next;
    std::vector<std::string> vals = s.ranges.empty() ? std::vector<std::string>{s.text} : values(s);
    next.reserve(partial.size() * vals.size());
    for (const std::string& head : partial) {
      for (const std::string& v : vals) next.push_back(head + v);
    }
    partial = std::move(next);
  }
  for (auto& h : partial) hosts.push_back(std::move(h));
}

// Splits at commas outside brackets.
std::vector<std::string_view> entries(std::string_view text) {
  std::vector<std::string_view> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      out.push_back(text.substr(start, i - start));
      start = i + 1;
    } else if (text[i] == '[') {
      ++depth;
    } else if (text[i] == ']') {
      --depth;
    }
  }
  return out;
}

}  // namespace

Hostlist expand_hostlist(std::string_view text, std::size_t max_hosts) {
  Hostlist out;
  auto fail = [&](const std::string& what) {
    out.hosts.clear();
    out.error = what + " in '" + std::string(text) + "'";
    return out;
  };
  if (text.empty()) return fail("no host");
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c)) || !std::isprint(static_cast<unsigned char>(c)))
      return fail("a space or control character");
  }
  unsigned long long total = 0;
  for (std::string_view entry : entries(text)) {
    if (entry.empty()) return fail("an empty entry");
    std::vector<Segment> segments;
    unsigned long long n = 0;
    if (std::string error = parse_entry(entry, max_hosts, segments, n); !error.empty()) {
      return fail(error);
    }
    total += n;
    if (total > max_hosts) return fail("more than " + std::to_string(max_hosts) + " hosts");
    expand(segments, out.hosts);
  }
  return out;
}

}  // namespace ddprun::launcher
