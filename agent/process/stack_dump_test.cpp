#include "agent/process/stack_dump.hpp"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const char* const kVenvBin = "/root/.cache/ddprun/torch2-venv/bin";

// The frame the native tools must name. noinline and an endless loop: never a tail call.
__attribute__((noinline)) void hung_here_for_test(int ready_fd) {
  (void)!::write(ready_fd, "r", 1);
  for (;;) ::pause();
}

// A forked or spawned process the test owns: SIGKILLed and reaped on destruction.
class Child {
 public:
  // Forks a child that blocks in hung_here_for_test(); returns once it is inside.
  static Child hung() {
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::close(ready[0]);
      hung_here_for_test(ready[1]);
    }
    ::close(ready[1]);
    char c;
    EXPECT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
    return Child(pid);
  }

  // /usr/bin/python3 running `script`, which writes one byte to stdout when ready.
  static Child python(const std::string& script) {
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(ready[1], STDOUT_FILENO);
      ::execl("/usr/bin/python3", "python3", "-c", script.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(ready[1]);
    char c;
    EXPECT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
    return Child(pid);
  }

  Child(Child&& other) noexcept : pid_(std::exchange(other.pid_, -1)) {}
  ~Child() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

  // Stops it and waits (WUNTRACED) until the kernel reports it stopped.
  void stop() const {
    ::kill(pid_, SIGSTOP);
    int status = 0;
    ASSERT_EQ(::waitpid(pid_, &status, WUNTRACED), pid_);
    ASSERT_TRUE(WIFSTOPPED(status));
  }

 private:
  explicit Child(pid_t pid) : pid_(pid) {}
  pid_t pid_;
};

char state_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), {});
  auto close = s.rfind(')');
  return close != std::string::npos && s.size() > close + 2 ? s[close + 2] : '?';
}

// The state a process settles in: right after a tool detaches, a sleeping or stopped worker
// can still read 'R' or 't' for a moment on a loaded machine. Polls for up to 2 s.
char settled_state(pid_t pid, char want) {
  char state = state_of(pid);
  for (int i = 0; i < 200 && state != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    state = state_of(pid);
  }
  return state;
}

bool has_tool(const std::string& path) {
  return ::access(path.c_str(), X_OK) == 0;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

class StackDumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ddprun_stack_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  StackDump dump(pid_t pid, StackDumpOptions options) {
    auto future = boost::asio::co_spawn(
        io_, dump_stacks(io_.get_executor(), pid, (dir_ / "stacks.txt").string(), options),
        boost::asio::use_future);
    io_.run();
    return future.get();
  }

  // A directory holding only links to the named tools (those that exist here).
  std::string tools_dir(const std::vector<std::string>& tools) {
    fs::path bin = dir_ / "bin";
    fs::create_directories(bin);
    for (const auto& t : tools) {
      if (fs::exists(t)) fs::create_symlink(t, bin / fs::path(t).filename());
    }
    return bin.string();
  }

  static std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  boost::asio::io_context io_;
  fs::path dir_;
};

TEST_F(StackDumpTest, NativeStacksNameTheBlockedFunction) {
  if (!has_tool("/usr/bin/eu-stack") && !has_tool("/usr/bin/gdb")) GTEST_SKIP() << "no tool";
  Child child = Child::hung();
  StackDumpOptions options;
  options.search_path = "/usr/bin:/bin";  // eu-stack (or gdb), no py-spy
  StackDump d = dump(child.pid(), options);
  std::string text = slurp(d.path);
  EXPECT_NE(text.find("hung_here_for_test"), std::string::npos) << text;
  EXPECT_NE(text.find("(native, every thread) ==="), std::string::npos) << text;
  ASSERT_FALSE(d.head.empty()) << text;
  EXPECT_EQ(d.head[0].rfind("#0 ", 0), 0u) << d.head[0];
  EXPECT_NE(joined(d.head).find("hung_here_for_test"), std::string::npos) << joined(d.head);
  EXPECT_LE(d.head.size(), kStackHeadLines);
  // No py-spy on this search path.
  EXPECT_NE(joined(d.notes).find("py-spy not installed"), std::string::npos) << joined(d.notes);
  EXPECT_EQ(joined(d.notes).find("timed out"), std::string::npos) << joined(d.notes);
  EXPECT_EQ(settled_state(child.pid(), 'S'), 'S');
}

// Each native tool on a SIGSTOPped worker: it works, and the worker is still stopped after.
class StoppedWorkerTest : public StackDumpTest,
                          public ::testing::WithParamInterface<const char*> {};

TEST_P(StoppedWorkerTest, DumpsAndLeavesItStopped) {
  const std::string tool = GetParam();
  if (!has_tool(tool)) GTEST_SKIP() << tool << " is not installed";
  Child child = Child::hung();
  child.stop();
  StackDumpOptions options;
  options.search_path = tools_dir({tool});
  StackDump d = dump(child.pid(), options);
  std::string text = slurp(d.path);
  EXPECT_NE(text.find("hung_here_for_test"), std::string::npos) << text;
  EXPECT_FALSE(d.head.empty()) << text;
  EXPECT_EQ(settled_state(child.pid(), 'T'), 'T');
}

INSTANTIATE_TEST_SUITE_P(Tools, StoppedWorkerTest,
                         ::testing::Values("/usr/bin/eu-stack", "/usr/bin/gdb"));

TEST_F(StackDumpTest, PythonStacksComeFirstInTheHead) {
  const std::string py_spy = std::string(kVenvBin) + "/py-spy";
  if (!has_tool(py_spy) || !has_tool("/usr/bin/python3")) GTEST_SKIP() << "no py-spy/python3";
  Child child = Child::python(
      "import os, time\n"
      "def stuck_in_python():\n"
      "    os.write(1, b'r')\n"
      "    time.sleep(60)\n"
      "stuck_in_python()\n");
  StackDumpOptions options;
  options.search_path = std::string(kVenvBin) + ":/usr/bin:/bin";
  StackDump d = dump(child.pid(), options);
  std::string text = slurp(d.path);
  EXPECT_NE(text.find("=== py-spy dump --pid"), std::string::npos) << text;
  ASSERT_FALSE(d.head.empty()) << text;
  EXPECT_NE(d.head[0].find("stuck_in_python"), std::string::npos) << joined(d.head);
  EXPECT_TRUE(d.notes.empty()) << joined(d.notes);
}

TEST_F(StackDumpTest, NoToolSaysWhatToInstall) {
  Child child = Child::hung();
  StackDumpOptions options;
  options.search_path = tools_dir({});
  StackDump d = dump(child.pid(), options);
  std::string text = slurp(d.path);
  EXPECT_NE(text.find("install elfutils (eu-stack) or gdb"), std::string::npos) << text;
  EXPECT_NE(text.find("pip install py-spy"), std::string::npos) << text;
  EXPECT_EQ(d.notes.size(), 2u) << joined(d.notes);
  EXPECT_TRUE(d.head.empty());
}

TEST_F(StackDumpTest, ATimedOutToolIsKilledWithItsChildren) {
  Child child = Child::hung();
  std::string bin = tools_dir({});
  std::string sleeper_pid = (dir_ / "sleeper.pid").string();
  {
    std::ofstream script(bin + "/eu-stack");
    script << "#!/bin/sh\nsleep 100 &\necho $! > " << sleeper_pid << "\nwait\n";
  }
  fs::permissions(bin + "/eu-stack", fs::perms::owner_all);
  StackDumpOptions options;
  options.search_path = bin;
  options.timeout = 300ms;
  StackDump d = dump(child.pid(), options);
  EXPECT_LT(d.took, 1500ms);
  ASSERT_FALSE(d.notes.empty());
  EXPECT_EQ(d.notes[0], "eu-stack timed out after 300 ms");
  EXPECT_NE(slurp(d.path).find("eu-stack timed out after 300 ms: killed"), std::string::npos);
  // The tool's own child got the SIGKILL too: its pidfd turns readable (at once, or when the
  // kernel has finished killing it).
  int sleeper = static_cast<int>(::syscall(SYS_pidfd_open, std::stoi(slurp(sleeper_pid)), 0));
  if (sleeper >= 0) {
    pollfd p{sleeper, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 5000), 1) << "the tool's child survived the timeout";
    ::close(sleeper);
  }
  EXPECT_EQ(settled_state(child.pid(), 'S'), 'S');  // still running (sleeping in pause)
}

TEST_F(StackDumpTest, AFailingToolsErrorLineIsInTheNote) {
  Child child = Child::hung();
  std::string bin = tools_dir({});
  {
    std::ofstream script(bin + "/eu-stack");
    script << "#!/bin/sh\necho 'frames so far' && echo 'eu-stack: attach: Permission denied' >&2\n"
              "exit 2\n";
  }
  fs::permissions(bin + "/eu-stack", fs::perms::owner_all);
  StackDumpOptions options;
  options.search_path = bin;
  StackDump d = dump(child.pid(), options);
  ASSERT_FALSE(d.notes.empty());
  EXPECT_EQ(d.notes[0], "eu-stack exited with 2: eu-stack: attach: Permission denied");
  std::string text = slurp(d.path);
  EXPECT_NE(text.find("frames so far\neu-stack: attach: Permission denied\n=== eu-stack exited"),
            std::string::npos)
      << text;
}

TEST_F(StackDumpTest, AnExitedWorkerIsReportedNotDumped) {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT), 0);  // a zombie
  StackDumpOptions options;
  options.search_path = "/usr/bin:/bin";
  StackDump d = dump(pid, options);
  ::waitpid(pid, nullptr, 0);
  ASSERT_EQ(d.notes.size(), 1u) << joined(d.notes);
  EXPECT_NE(d.notes[0].find("has exited"), std::string::npos);
  EXPECT_TRUE(d.head.empty());
}

TEST_F(StackDumpTest, AnUncreatableFileThrows) {
  auto future = boost::asio::co_spawn(
      io_, dump_stacks(io_.get_executor(), ::getpid(), (dir_ / "no" / "such.txt").string()),
      boost::asio::use_future);
  io_.run();
  EXPECT_THROW(future.get(), std::system_error);
}

}  // namespace
}  // namespace ddprun::agent
