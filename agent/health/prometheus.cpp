#include "agent/health/prometheus.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <stdexcept>

namespace ddprun::agent {
namespace {

bool is_name(std::string_view name, bool colons) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char ch = name[i];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
              (colons && ch == ':') || (i > 0 && ch >= '0' && ch <= '9');
    if (!ok) return false;
  }
  return true;
}

[[noreturn]] void fail(const std::string& message) {
  throw std::logic_error("prometheus: " + message);
}

// `quote`: also escape '"' (label values; HELP text keeps quotes as they are).
void append_escaped(std::string& out, std::string_view text, bool quote) {
  for (char ch : text) {
    if (ch == '\\') {
      out += "\\\\";
    } else if (ch == '\n') {
      out += "\\n";
    } else if (quote && ch == '"') {
      out += "\\\"";
    } else {
      out += ch;
    }
  }
}

}  // namespace

std::string prometheus_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::to_chars_result r;
  // Whole numbers that a double holds exactly print as integers ("3", not "3.0" or "3e+00").
  if (std::trunc(value) == value && std::fabs(value) < 9007199254740992.0) {
    r = std::to_chars(buf, buf + sizeof buf, static_cast<std::int64_t>(value));
  } else {
    r = std::to_chars(buf, buf + sizeof buf, value);  // shortest round-trip, no locale
  }
  return std::string(buf, r.ptr);
}

void PrometheusText::family(std::string_view name, std::string_view type, std::string_view help) {
  const std::string n(name);
  if (!is_name(name, true)) fail("invalid metric name '" + n + "'");
  if (type != "counter" && type != "gauge") {
    fail("metric " + n + ": type must be counter or gauge, not '" + std::string(type) + "'");
  }
  if (type == "counter" && !(name.size() > 6 && name.ends_with("_total"))) {
    fail("counter " + n + " must be named *_total");
  }
  if (!declared_.insert(n).second) fail("metric family " + n + " declared twice");
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  append_escaped(out_, help, false);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
  current_ = n;
}

void PrometheusText::sample(std::string_view name, double value, const Labels& labels) {
  if (name != current_) {
    const std::string n(name);
    if (declared_.contains(n)) fail("sample of " + n + " must directly follow its family's TYPE");
    fail("sample of undeclared metric family " + n);
  }
  // Built aside, so that a refused label leaves the page as it was.
  std::string line(name);
  if (!labels.empty()) {
    line += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      const auto& [label, text] = labels[i];
      if (!is_name(label, false) || label.starts_with("__")) {
        fail("metric " + current_ + ": invalid label name '" + label + "'");
      }
      for (size_t j = 0; j < i; ++j) {
        if (labels[j].first == label) fail("metric " + current_ + ": label " + label + " twice");
      }
      if (i > 0) line += ',';
      line += label;
      line += "=\"";
      append_escaped(line, text, true);
      line += '"';
    }
    line += '}';
  }
  line += ' ';
  line += prometheus_value(value);
  line += '\n';
  out_ += line;
}

}  // namespace ddprun::agent
