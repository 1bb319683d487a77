// Error recording for C++ workers: the counterpart of torchelastic's `@record`.
//
//   int main(int argc, char** argv) {
//     return ddprun::record([&] { return train(argc, argv); });
//   }
//
// On an uncaught exception, record() writes the torchelastic error file named by
// TORCHELASTIC_ERROR_FILE (when set), prints "[rank N]: <Type>: <message>" to stderr and returns
// 1, so the launcher's failure summary shows the C++ error as it shows a Python traceback.
// The file has the shape Python's ErrorHandler writes:
//   {"message": {"message": "<Type>: <text>",
//                "extraInfo": {"py_callstack": "<details>", "timestamp": "<unix seconds>"}}}
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <string_view>

namespace ddprun {

// Runs body() and returns its result; see above for what happens on an exception.
int record(const std::function<int()>& body);

// What record() writes, split out for callers that catch exceptions themselves.
struct ErrorReport {
  std::string type;       // e.g. "std::runtime_error", "c10::Error"
  std::string message;    // the exception's text, without backtrace
  std::string callstack;  // details for "py_callstack" (a backtrace when one is known)
};

// Describes the exception currently held by `e`.
ErrorReport describe_exception(std::exception_ptr e);

// The JSON document for `report` with the given unix timestamp.
std::string error_file_json(const ErrorReport& report, long long unix_seconds);

// Writes the error file atomically (temp file + rename) to `path`, or to
// $TORCHELASTIC_ERROR_FILE when `path` is empty. Returns false (and writes nothing) when no path
// is known or the write fails.
bool write_error_file(const ErrorReport& report, const std::string& path = {});

}  // namespace ddprun
