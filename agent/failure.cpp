#include "agent/failure.hpp"

#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "store/sys/log.hpp"

namespace ddprun::agent {
namespace {

constexpr std::string_view kNotAvailable = "<N/A>";

std::optional<int64_t> to_seconds(const nlohmann::json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number()) return static_cast<int64_t>(v.get<double>());
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    int64_t out = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec == std::errc() && p != s.data()) return out;
  }
  return std::nullopt;
}

std::string format_time(int64_t seconds) {
  time_t t = static_cast<time_t>(seconds);
  struct tm tm {};
  ::localtime_r(&t, &tm);
  char buf[32];
  ::strftime(buf, sizeof(buf), "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

// Indents continuation lines like torchrun does for tracebacks.
std::string indent(std::string_view text) {
  std::string out;
  for (char c : text) {
    out += c;
    if (c == '\n') out += "  ";
  }
  return out;
}

}  // namespace

std::string fatal_signal_text(int signo) {
  switch (signo) {
    case SIGSEGV:
    case SIGBUS:
    case SIGABRT:
    case SIGFPE:
    case SIGILL:
      break;
    default:
      return {};
  }
  std::string text = ::strsignal(signo);  // "Segmentation fault"
  if (!text.empty()) text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  return signal_name(signo) + ", " + text;
}

std::vector<std::string> last_lines(const std::string& path, size_t max_lines) {
  constexpr std::streamoff kTail = 16 * 1024;
  constexpr size_t kLineMax = 200;
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > kTail ? size - kTail : 0;
  in.seekg(start);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines;
  size_t pos = 0;
  if (start > 0) {  // the first line is cut: skip it
    size_t nl = text.find('\n');
    pos = nl == std::string::npos ? text.size() : nl + 1;
  }
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.size() > kLineMax) line = line.substr(0, kLineMax - 3) + "...";
    if (!line.empty()) lines.push_back(std::move(line));
    pos = end + 1;
  }
  if (lines.size() > max_lines) lines.erase(lines.begin(), lines.end() - max_lines);
  return lines;
}

std::optional<ErrorFileData> read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  ErrorFileData data;
  auto json = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object() || !json.contains("message")) {
    data.message = "unreadable error file " + path;
    data.traceback = data.message;
    return data;
  }
  const auto& message = json["message"];
  if (message.is_string()) {
    data.message = message.get<std::string>();
    data.traceback = data.message;
    if (json.contains("timestamp")) data.timestamp = to_seconds(json["timestamp"]);
  } else if (message.is_object()) {
    if (message.contains("message") && message["message"].is_string()) {
      data.message = message["message"].get<std::string>();
    } else {
      data.message = std::string(kNotAvailable);
    }
    data.traceback = data.message;
    if (message.contains("extraInfo") && message["extraInfo"].is_object()) {
      const auto& extra = message["extraInfo"];
      if (extra.contains("py_callstack") && extra["py_callstack"].is_string()) {
        data.traceback = extra["py_callstack"].get<std::string>();
      }
      if (extra.contains("timestamp")) data.timestamp = to_seconds(extra["timestamp"]);
    }
  } else {
    data.message = message.dump();
    data.traceback = data.message;
  }
  // The one-line form: the last non-empty line of a multi-line message.
  if (auto nl = data.message.find('\n'); nl != std::string::npos) {
    std::string m = data.message;
    while (!m.empty() && m.back() == '\n') m.pop_back();
    data.message = m.substr(m.rfind('\n') + 1);
  }
  return data;
}

ProcessFailure make_failure(int local_rank, int global_rank, pid_t pid, ExitStatus status,
                            const std::string& error_file_path, int64_t observed_at,
                            uint64_t sequence) {
  ProcessFailure f;
  f.local_rank = local_rank;
  f.global_rank = global_rank;
  f.pid = pid;
  f.status = status;
  f.sequence = sequence;
  f.timestamp = observed_at;
  auto data = error_file_path.empty() ? std::nullopt : read_error_file(error_file_path);
  if (data) {
    f.error_file = error_file_path;
    f.message = data->message;
    f.traceback = data->traceback;
    if (data->timestamp) f.timestamp = *data->timestamp;
  } else {
    f.error_file = std::string(kNotAvailable);
    if (status.kind == ExitStatus::Kind::kSignaled) {
      f.message = "Signal " + std::to_string(status.value) + " (" + signal_name(status.value) +
                  ") received by PID " + std::to_string(pid);
    } else {
      f.message = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";
    }
    f.traceback = f.message;
  }
  return f;
}

const ProcessFailure& root_cause(const std::vector<ProcessFailure>& failures) {
  return *std::min_element(failures.begin(), failures.end(), [](const auto& a, const auto& b) {
    if (a.timestamp != b.timestamp) return a.timestamp < b.timestamp;
    return a.sequence < b.sequence;
  });
}

std::string format_failure_summary(std::string_view title_name,
                                   const std::vector<ProcessFailure>& failures,
                                   std::string_view host) {
  const ProcessFailure& root = root_cause(failures);
  std::vector<const ProcessFailure*> ordered;
  for (const auto& f : failures) ordered.push_back(&f);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](auto* a, auto* b) { return a->global_rank < b->global_rank; });

  std::string title = std::string(title_name) + " FAILED";
  size_t width = title.size();
  std::string root_text;
  std::vector<std::string> others;
  int idx = 0;
  for (const ProcessFailure* f : ordered) {
    std::string text = "[" + std::to_string(idx++) + "]:\n";
    text += "  time      : " + format_time(f->timestamp) + "\n";
    text += "  host      : " + std::string(host) + "\n";
    text += "  rank      : " + std::to_string(f->global_rank) +
            " (local_rank: " + std::to_string(f->local_rank) + ")\n";
    text +=
        "  exitcode  : " + std::to_string(f->status.torchrun_code()) +
        " (pid: " + std::to_string(f->pid) + ")" +
        (f->status.kind == ExitStatus::Kind::kSignaled ? " (" + signal_name(f->status.value) + ")"
                                                       : std::string()) +
        "\n";
    if (!f->cause.empty()) text += "  cause     : " + f->cause + "\n";
    for (size_t i = 0; i < f->stderr_tail.size(); ++i) {
      text += (i == 0 ? "  stderr    : " : "              ") + f->stderr_tail[i] + "\n";
    }
    if (f->peak_rss_kb) text += "  peak rss  : " + format_bytes(f->peak_rss_kb * 1024) + "\n";
    text += "  error_file: " + f->error_file + "\n";
    if (!f->collective.empty()) text += "  collective: " + f->collective + "\n";
    if (!f->hang.empty()) {
      text += "  hung      : " + f->hang + "\n";
      text += "  stacks    : " + f->stacks_path + "\n";
      std::string head;
      for (const auto& line : f->stack_head) head += (head.empty() ? "" : "\n") + line;
      text += "  traceback : " + indent(head.empty() ? f->traceback : head);
    } else {
      text += "  traceback : " + indent(f->traceback);
    }
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      width = std::max(width, end - start);
      start = end + 1;
    }
    if (f == &root) {
      root_text = std::move(text);
    } else {
      others.push_back(std::move(text));
    }
  }
  width = std::min<size_t>(width, 60);
  std::string border(width, '=');
  std::string section(width, '-');
  std::string out = border + "\n" + title + "\n" + section + "\nFailures:\n";
  if (others.empty()) {
    out += "  <NO_OTHER_FAILURES>\n";
  } else {
    for (const auto& o : others) out += o + "\n";
  }
  out += section + "\nRoot Cause (first observed failure):\n" + root_text + "\n" + border + "\n";
  return out;
}

std::string write_launcher_error_file(const std::vector<ProcessFailure>& failures,
                                      const std::string& path) {
  const ProcessFailure& root = root_cause(failures);
  const int code = root.status.torchrun_code();
  std::string content;
  if (root.error_file != kNotAvailable) {
    std::ifstream in(root.error_file);
    std::stringstream ss;
    ss << in.rdbuf();
    content = ss.str();
    auto json = nlohmann::json::parse(content, nullptr, /*allow_exceptions=*/false);
    if (!json.is_discarded() && json.is_object() && json.contains("message") &&
        json["message"].is_object()) {
      json["message"]["errorCode"] = code;
      content = json.dump();
    }
  } else {
    std::string message = root.message + (root.cause.empty() ? "" : ": " + root.cause);
    nlohmann::json json = {
        {"message",
         {{"message", message},
          {"extraInfo",
           {{"py_callstack", root.traceback}, {"timestamp", std::to_string(root.timestamp)}}},
          {"errorCode", code}}}};
    content = json.dump();
  }
  ::unlink(path.c_str());  // as torchrun: a worker may have written there before
  std::ofstream out(path, std::ios::trunc);
  out << content;
  out.close();
  if (!out) return "cannot write the error file " + path + ": " + ::strerror(errno);
  return {};
}

std::vector<ProcessFailure> collect_new_failures(const WorkerGroup& group,
                                                 const ProcessContext& pctx,
                                                 std::set<int>& reported,
                                                 bool only_with_error_file) {
  std::vector<ProcessFailure> out;
  for (const Worker& w : group.workers()) {
    const auto& e = pctx.exit_of(w.local_rank);
    if (!e || e->status.success() || reported.count(w.local_rank)) continue;
    const WorkerLaunch& launch = pctx.launch_of(w.local_rank);
    ProcessFailure f = make_failure(w.local_rank, w.global_rank, pctx.pid_of(w.local_rank),
                                    e->status, launch.error_file, e->unix_time, e->sequence);
    if (only_with_error_file && f.error_file == "<N/A>") continue;
    f.cause = e->cause;
    if (f.cause.empty() && e->status.kind == ExitStatus::Kind::kSignaled) {
      f.cause = fatal_signal_text(e->status.value);
    }
    f.peak_rss_kb = e->peak_rss_kb;
    const StreamTarget& err = launch.err;
    if (f.error_file == "<N/A>" &&
        (err.kind == StreamTarget::Kind::kFile || err.kind == StreamTarget::Kind::kTee)) {
      f.stderr_tail = last_lines(err.path);
    }
    reported.insert(w.local_rank);
    std::string what = e->status.kind == ExitStatus::Kind::kExited
                           ? "failed with exitcode " + std::to_string(e->status.value)
                           : e->status.describe() + " (exitcode " +
                                 std::to_string(e->status.torchrun_code()) + ")";
    std::string detail = f.error_file != "<N/A>" ? ": " + f.message
                         : !f.cause.empty()      ? ": " + f.cause
                                                 : "";
    sys::log_line("attempt " + std::to_string(group.round().restart_count) + ": worker " +
                  std::to_string(w.local_rank) + " (rank " + std::to_string(w.global_rank) +
                  ", pid " + std::to_string(f.pid) + ") " + what + detail);
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace ddprun::agent
