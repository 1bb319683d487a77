#include <cstdlib>

#include "launcher/cli_parser.hpp"
#include "launcher/fanout/fanout_config.hpp"

namespace ddprun::launcher {
namespace {

constexpr std::string_view kFanoutFlags[] = {
    "hosts",         "hostfile",    "include",  "exclude",
    "ssh_command",   "ssh_options", "ssh_port", "ssh_connect_timeout",
    "remote_ddprun", "export"};

[[noreturn]] void fail(const std::string& source, const std::string& value,
                       const std::string& what) {
  throw CliError(source + "=" + value + ": " + what);
}

}  // namespace

bool is_fanout_flag(std::string_view name) {
  for (auto f : kFanoutFlags) {
    if (f == name) return true;
  }
  return false;
}

bool apply_fanout_value(FanoutConfig& c, const std::string& name, const std::string& value,
                        const std::string& source) {
  if (name == "hosts") {
    if (value.empty()) fail(source, value, "expected HOST,HOST,...");
    c.hosts = value;
  } else if (name == "hostfile") {
    if (value.empty()) fail(source, value, "expected a file name");
    c.hostfile = value;
  } else if (name == "include") {
    c.include = value;
  } else if (name == "exclude") {
    c.exclude = value;
  } else if (name == "ssh_command") {
    if (value.empty()) fail(source, value, "must not be empty");
    c.ssh_command = value;
  } else if (name == "ssh_options") {
    c.ssh_options = value;
  } else if (name == "ssh_port") {
    auto n = parse_int(value);
    if (!n || *n < 1 || *n > 65535) fail(source, value, "a port is a number from 1 to 65535");
    c.ssh_port = static_cast<int>(*n);
  } else if (name == "ssh_connect_timeout") {
    char* end = nullptr;
    double d = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(d > 0) || d > 86400) {
      fail(source, value, "expected a positive number of seconds");
    }
    c.ssh_connect_timeout = d;
  } else if (name == "remote_ddprun") {
    if (value.empty() || value.front() != '/') fail(source, value, "expected an absolute path");
    c.remote_ddprun = value;
  } else if (name == "export") {
    c.exports.clear();
    for (auto& item : split(value, ',')) {
      if (!item.empty()) c.exports.push_back(item);
    }
  } else {
    return false;
  }
  return true;
}

}  // namespace ddprun::launcher
