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

TEST(Failure, ExitStatusText) {
  EXPECT_EQ(ExitStatus::exec_failed(ENOENT).shell_code(), 127);
  EXPECT_EQ(ExitStatus::exited(4).describe(), "exited with 4");
  EXPECT_EQ(ExitStatus::signaled(SIGKILL).describe(), "was killed by SIGKILL");
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
  EXPECT_NE(text.find("exitcode  : -9 (pid: 100) (SIGKILL)\n"), std::string::npos);
  EXPECT_NE(text.find("exitcode  : 2 (pid: 101)\n"), std::string::npos);
  EXPECT_NE(text.find("Signal 9 (SIGKILL) received by PID 100"), std::string::npos);
  EXPECT_EQ(text.find("cause"), std::string::npos);
  EXPECT_EQ(text.find("peak rss"), std::string::npos);
}

TEST(Summary, ASigkillsCauseAndThePeakRss) {
  auto f = make_failure(0, 3, 4133, ExitStatus::signaled(SIGKILL), "", 1700000005, 1);
  f.cause = "killed by the kernel's OOM killer (rss 45.1 GiB; node 62.8 of 64.0 GiB in use)";
  f.peak_rss_kb = uint64_t{47} << 20;
  auto text = format_failure_summary("x", {f}, "h");
  EXPECT_NE(text.find("  exitcode  : -9 (pid: 4133) (SIGKILL)\n"
                      "  cause     : killed by the kernel's OOM killer (rss 45.1 GiB; node 62.8 of "
                      "64.0 GiB in use)\n"
                      "  peak rss  : 47.0 GiB\n"
                      "  error_file: <N/A>\n"),
            std::string::npos)
      << text;
}

TEST(Summary, FatalSignalsAndTheStderrTail) {
  EXPECT_EQ(fatal_signal_text(SIGSEGV), "SIGSEGV, segmentation fault");
  EXPECT_EQ(fatal_signal_text(SIGABRT), "SIGABRT, aborted");
  EXPECT_EQ(fatal_signal_text(SIGBUS), "SIGBUS, bus error");
  EXPECT_EQ(fatal_signal_text(SIGTERM), "");
  EXPECT_EQ(fatal_signal_text(SIGKILL), "");

  std::string log;
  for (int i = 0; i < 3000; ++i) log += "line " + std::to_string(i) + "\n";
  log += "\n" + std::string(300, 'x') + "\nFatal Python error: Segmentation fault\n\n";
  auto path = write_temp("stderr.log", log);
  auto tail = last_lines(path, 4);
  ASSERT_EQ(tail.size(), 4u);
  EXPECT_EQ(tail[0], "line 2998");
  EXPECT_EQ(tail[2], std::string(197, 'x') + "...");
  EXPECT_EQ(tail[3], "Fatal Python error: Segmentation fault");
  EXPECT_EQ(last_lines(path).size(), 10u);
  EXPECT_TRUE(last_lines("/nonexistent").empty());
  std::remove(path.c_str());

  auto f = make_failure(0, 1, 7, ExitStatus::signaled(SIGSEGV), "", 1700000005, 1);
  f.cause = fatal_signal_text(SIGSEGV);
  f.stderr_tail = {"Fatal Python error: Segmentation fault", "  File \"x.py\", line 3 in crash"};
  auto text = format_failure_summary("x", {f}, "h");
  EXPECT_NE(text.find("  exitcode  : -11 (pid: 7) (SIGSEGV)\n"
                      "  cause     : SIGSEGV, segmentation fault\n"
                      "  stderr    : Fatal Python error: Segmentation fault\n"
                      "                File \"x.py\", line 3 in crash\n"
                      "  error_file: <N/A>\n"),
            std::string::npos)
      << text;
}

// TORCHELASTIC_ERROR_FILE of ddprun itself: the root cause's file with its errorCode, as torchrun
// writes it; one made from the failure where the worker wrote none.
TEST(LauncherErrorFile, CopiesTheRootCausesFileWithItsCode) {
  auto child =
      write_temp("child.json", R"({"message": {"message": "ValueError: boom", "extraInfo": {)"
                               R"("py_callstack": "tb", "timestamp": "1700000001"}}})");
  auto root = make_failure(1, 1, 101, ExitStatus::exited(2), child, 1700000009, 1);
  auto later = make_failure(0, 0, 100, ExitStatus::signaled(SIGTERM), "", 1700000005, 2);
  auto out = write_temp("parent.json", "stale");
  EXPECT_EQ(write_launcher_error_file({later, root}, out), "");
  auto data = read_error_file(out);
  ASSERT_TRUE(data);
  EXPECT_EQ(data->message, "ValueError: boom");
  EXPECT_EQ(data->traceback, "tb");
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(R"("errorCode":2)"), std::string::npos) << text;
  std::remove(child.c_str());
  std::remove(out.c_str());
}

TEST(LauncherErrorFile, MadeFromAFailureWithoutOne) {
  auto f = make_failure(0, 3, 4133, ExitStatus::signaled(SIGKILL), "", 1700000005, 1);
  f.cause = "killed by the kernel's OOM killer (rss 1.0 GiB)";
  auto out = write_temp("made.json", "");
  EXPECT_EQ(write_launcher_error_file({f}, out), "");
  auto data = read_error_file(out);
  ASSERT_TRUE(data);
  EXPECT_EQ(data->message,
            "Signal 9 (SIGKILL) received by PID 4133: killed by the kernel's OOM killer (rss "
            "1.0 GiB)");
  EXPECT_EQ(data->timestamp, 1700000005);
  std::remove(out.c_str());
  EXPECT_NE(write_launcher_error_file({f}, "/nonexistent-dir/x.json"), "");
}

}  // namespace
}  // namespace ddprun::agent
