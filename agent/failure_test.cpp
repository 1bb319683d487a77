#include "agent/failure.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace ddprun::agent {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  auto path = std::filesystem::temp_directory_path() /
              ("ddprun_failure_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path) << text;
  return path.string();
}

TEST(ErrorFile, ReadsPyTorchRecordFormat) {
  auto path =
      write_temp("record.json",
                 R"({"message": {"message": "ValueError: boom", "extraInfo": {)"
                 R"("py_callstack": "Traceback (most recent call last):\n  x\nValueError: boom\n",)"
                 R"( "timestamp": "1700000000"}}})");
  auto data = read_error_file(path);
  ASSERT_TRUE(data);
  EXPECT_EQ(data->message, "ValueError: boom");
  EXPECT_EQ(data->traceback, "Traceback (most recent call last):\n  x\nValueError: boom\n");
  EXPECT_EQ(data->timestamp, 1700000000);
  std::remove(path.c_str());
}

TEST(ErrorFile, ReadsStringMessageFormat) {
  auto path = write_temp("str.json", R"({"message": "worker crashed", "timestamp": 1700000005})");
  auto data = read_error_file(path);
  ASSERT_TRUE(data);
  EXPECT_EQ(data->message, "worker crashed");
  EXPECT_EQ(data->timestamp, 1700000005);
  std::remove(path.c_str());
}

TEST(ErrorFile, MissingIsNulloptAndGarbageIsReported) {
  EXPECT_FALSE(read_error_file("/nonexistent/error.json"));
  auto path = write_temp("bad.json", "{not json");
  auto data = read_error_file(path);
  ASSERT_TRUE(data);
  EXPECT_NE(data->message.find("unreadable"), std::string::npos);
  EXPECT_FALSE(data->timestamp);
  std::remove(path.c_str());
}

TEST(Failure, SignalDeathWithoutErrorFile) {
  auto f = make_failure(1, 3, 4242, ExitStatus::signaled(SIGKILL), "/nonexistent/error.json",
                        1700000000, 1);
  EXPECT_EQ(f.error_file, "<N/A>");
  EXPECT_EQ(f.message, "Signal 9 (SIGKILL) received by PID 4242");
  EXPECT_EQ(f.status.shell_code(), 137);
  EXPECT_EQ(f.status.torchrun_code(), -9);
}

TEST(Failure, ExitCodeWithoutErrorFile) {
  auto f = make_failure(0, 0, 10, ExitStatus::exited(3), "", 1700000000, 1);
  EXPECT_EQ(f.status.shell_code(), 3);
  EXPECT_NE(f.message.find("To enable traceback"), std::string::npos);
}

TEST(Failure, RootCauseIsEarliestThenFirstObserved) {
  std::vector<ProcessFailure> fs(3);
  fs[0].timestamp = 20;
  fs[0].sequence = 1;
  fs[0].global_rank = 0;
  fs[1].timestamp = 10;
  fs[1].sequence = 3;
  fs[1].global_rank = 1;
  fs[2].timestamp = 10;
  fs[2].sequence = 2;
  fs[2].global_rank = 2;
  EXPECT_EQ(root_cause(fs).global_rank, 2);
}

TEST(Failure, SignalNames) {
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(ExitStatus::exec_failed(ENOENT).shell_code(), 127);
  EXPECT_EQ(ExitStatus::exited(4).describe(), "exited with 4");
  EXPECT_EQ(ExitStatus::signaled(SIGKILL).describe(), "was killed by SIGKILL");
  EXPECT_EQ(signal_number("SIGUSR1"), SIGUSR1);
  EXPECT_EQ(signal_number("TERM"), SIGTERM);
  EXPECT_EQ(signal_number("15"), 15);
  EXPECT_FALSE(signal_number("SIGNOPE"));
}

TEST(Summary, TorchrunLayout) {
  auto root = make_failure(1, 1, 11910, ExitStatus::exited(1), "", 1700000000, 1);
  root.traceback = "Traceback (most recent call last):\n  File \"x.py\"\nValueError: boom\n";
  root.error_file = "/tmp/logs/job_x/attempt_1/1/error.json";
  auto text = format_failure_summary("train.py", {root}, "node0");
  // The border is as wide as the widest line, at most 60 characters (torchrun's rule).
  const size_t width = text.find('\n');
  EXPECT_EQ(text.substr(0, width), std::string(width, '='));
  EXPECT_EQ(width, std::string("  error_file: /tmp/logs/job_x/attempt_1/1/error.json").size());
  EXPECT_NE(text.find("\ntrain.py FAILED\n"), std::string::npos);
  EXPECT_NE(text.find("Failures:\n  <NO_OTHER_FAILURES>\n"), std::string::npos);
  EXPECT_NE(text.find("Root Cause (first observed failure):\n[0]:\n"), std::string::npos);
  EXPECT_NE(text.find("  host      : node0\n"), std::string::npos);
  EXPECT_NE(text.find("  rank      : 1 (local_rank: 1)\n"), std::string::npos);
  EXPECT_NE(text.find("  exitcode  : 1 (pid: 11910)\n"), std::string::npos);
  EXPECT_NE(text.find("  error_file: /tmp/logs/job_x/attempt_1/1/error.json\n"), std::string::npos);
  EXPECT_NE(text.find("  traceback : Traceback (most recent call last):\n    File \"x.py\"\n  "
                      "ValueError: boom\n"),
            std::string::npos);
  EXPECT_EQ(text.substr(text.size() - width - 1), std::string(width, '=') + "\n");
  root.traceback = std::string(200, 'x');
  auto wide = format_failure_summary("train.py", {root}, "node0");
  EXPECT_EQ(wide.find('\n'), 60u);
}

TEST(Summary, OtherFailuresListedByRank) {
  auto a = make_failure(0, 0, 100, ExitStatus::signaled(SIGKILL), "", 1700000005, 2);
  auto b = make_failure(1, 1, 101, ExitStatus::exited(2), "", 1700000001, 1);
  auto text = format_failure_summary("x", {a, b}, "h");
  auto others = text.find("Failures:\n[0]:");
  auto root = text.find("Root Cause (first observed failure):\n[1]:");
  EXPECT_NE(others, std::string::npos);
  EXPECT_NE(root, std::string::npos);
  EXPECT_NE(text.find("exitcode  : -9 (pid: 100)"), std::string::npos);
  EXPECT_NE(text.find("Signal 9 (SIGKILL) received by PID 100"), std::string::npos);
}

}  // namespace
}  // namespace ddprun::agent
