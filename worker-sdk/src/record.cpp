#include "ddprun/record.hpp"

#include <c10/util/Exception.h>
#include <cxxabi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <typeinfo>

namespace ddprun {
namespace {

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(mangled);
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);  // UTF-8 passes through unchanged
        }
    }
  }
  out += '"';
}

}  // namespace

ErrorReport describe_exception(std::exception_ptr e) {
  ErrorReport r;
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& err) {
    r.type = demangle(typeid(err).name());
    r.message = err.what_without_backtrace();
    r.callstack = err.what();
  } catch (const std::exception& err) {
    r.type = demangle(typeid(err).name());
    r.message = err.what();
  } catch (...) {
    r.type = "unknown exception";
    r.message = "an exception not derived from std::exception";
  }
  if (r.callstack.empty()) {
    r.callstack = "C++ exception (no backtrace recorded)\n" + r.type + ": " + r.message + "\n";
  }
  return r;
}

std::string error_file_json(const ErrorReport& report, long long unix_seconds) {
  std::string out = "{\"message\": {\"message\": ";
  append_json_string(out, report.type + ": " + report.message);
  out += ", \"extraInfo\": {\"py_callstack\": ";
  append_json_string(out, report.callstack);
  out += ", \"timestamp\": ";
  append_json_string(out, std::to_string(unix_seconds));
  out += "}}}";
  return out;
}

bool write_error_file(const ErrorReport& report, const std::string& path) {
  std::string file = path;
  if (file.empty()) {
    const char* env = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (env == nullptr || *env == '\0') return false;
    file = env;
  }
  const long long now = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  std::error_code ec;
  std::filesystem::path target(file);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
  std::filesystem::path tmp = target;
  tmp += ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << error_file_json(report, now);
    out.close();
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return false;
    }
  }
  std::filesystem::rename(tmp, target, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  return !ec;
}

int record(const std::function<int()>& body) {
  try {
    return body();
  } catch (...) {
    ErrorReport report = describe_exception(std::current_exception());
    const char* rank = std::getenv("RANK");
    std::cerr << "[rank " << (rank != nullptr ? rank : "?") << "]: " << report.type << ": "
              << report.message << std::endl;
    write_error_file(report);
    return 1;
  }
}

}  // namespace ddprun
