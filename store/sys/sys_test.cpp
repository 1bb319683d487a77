#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <regex>

#include "store/sys/fd.hpp"
#include "store/sys/log.hpp"
#include "store/sys/net.hpp"
#include "store/sys/path_search.hpp"
#include "store/sys/port_holder.hpp"
#include "store/sys/random.hpp"
#include "store/sys/signal_names.hpp"
#include "store/sys/temp_dir.hpp"
#include "store/sys/time_text.hpp"
#include "store/sys/token_file.hpp"

namespace ddprun::sys {
namespace {

using std::chrono::milliseconds;

TEST(SysTest, TempDirIsPrivateAndRemovedWithItsContents) {
  std::string path;
  {
    TempDir dir("ddprun-test-");
    path = dir.path();
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    UniqueFd f = open_for_write((path + "/file").c_str());
    ASSERT_TRUE(f);
    TempDir moved = std::move(dir);
    EXPECT_EQ(moved.path(), path);
    EXPECT_FALSE(dir);
  }
  struct stat st {};
  EXPECT_NE(::stat(path.c_str(), &st), 0);
}

// A socket this process listens on is found through /proc, with this program's command line;
// a port nobody listens on gives nothing.
TEST(SysTest, PortHolderIsTheProcessListening) {
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(listener);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  EXPECT_FALSE(find_port_holder(port)) << "bound, not listening yet";
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  auto holder = find_port_holder(port);
  ASSERT_TRUE(holder);
  EXPECT_EQ(holder->pid, ::getpid());
  EXPECT_NE(holder->command.find("sys_test"), std::string::npos) << holder->command;
  EXPECT_EQ(port_holder_text(port), " (port " + std::to_string(port) + " is held by pid " +
                                        std::to_string(::getpid()) + ": " + holder->command + ")");
  listener.reset();
  EXPECT_FALSE(find_port_holder(port));
  EXPECT_EQ(port_holder_text(port), "");
}

TEST(SysTest, EndpointTextBracketsIpv6Only) {
  EXPECT_EQ(endpoint_text("10.0.0.1", 29400), "10.0.0.1:29400");
  EXPECT_EQ(endpoint_text("node3", 1), "node3:1");
  EXPECT_EQ(endpoint_text("::1", 29400), "[::1]:29400");
  EXPECT_EQ(endpoint_text("fe80::1%eth0", 5), "[fe80::1%eth0]:5");
}

TEST(SysTest, OneLoopbackRule) {
  for (const char* h : {"localhost", "127.0.0.1", "127.1.2.3", "::1"})
    EXPECT_TRUE(is_loopback(h)) << h;
  for (const char* h : {"", "0.0.0.0", "::", "10.0.0.1", "node1", "localhost.example", "::2"}) {
    EXPECT_FALSE(is_loopback(h)) << h;
  }
  EXPECT_TRUE(is_wildcard("0.0.0.0"));
  EXPECT_TRUE(is_wildcard("::"));
  EXPECT_FALSE(is_wildcard("127.0.0.1"));
  EXPECT_TRUE(is_address_literal("::1"));
  EXPECT_TRUE(is_address_literal("10.1.2.3"));
  EXPECT_FALSE(is_address_literal("localhost"));
}

TEST(SysTest, ResolvesLiteralsWithoutLookup) {
  std::string error;
  auto v4 = resolve("127.0.0.1", 80, false, &error);
  ASSERT_EQ(v4.size(), 1u) << error;
  EXPECT_EQ(v4[0].family, AF_INET);
  auto v6 = resolve("::1", 80, true, &error);
  ASSERT_EQ(v6.size(), 1u) << error;
  EXPECT_EQ(v6[0].family, AF_INET6);
  EXPECT_TRUE(names_this_machine("127.0.0.1"));
  EXPECT_TRUE(names_this_machine(host_name()));
}

TEST(SysTest, SecondsText) {
  EXPECT_EQ(seconds_text(milliseconds(30000)), "30 s");
  EXPECT_EQ(seconds_text(milliseconds(500)), "0.5 s");
  EXPECT_EQ(seconds_text(milliseconds(1250)), "1.25 s");
  EXPECT_EQ(seconds_text(milliseconds(0)), "0 s");
}

TEST(SysTest, RandomIds) {
  EXPECT_TRUE(std::regex_match(random_hex(3), std::regex("[0-9a-f]{6}")));
  EXPECT_TRUE(std::regex_match(random_suffix(), std::regex("[a-z0-9_]{8}")));
  std::string uuid = random_uuid();
  EXPECT_TRUE(std::regex_match(
      uuid, std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")))
      << uuid;
  EXPECT_NE(random_uuid(), uuid);
}

TEST(SysTest, LogLineIsOneLineInTheOneFormat) {
  Pipe p = make_pipe();
  int saved = ::dup(STDERR_FILENO);
  ::dup2(p.write.get(), STDERR_FILENO);
  log_line("[ddpstore]", "listening");
  log_line("hello");
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  p.write.reset();
  char buf[512] = {};
  ssize_t n = ::read(p.read.get(), buf, sizeof buf - 1);
  ASSERT_GT(n, 0);
  std::string prefix = host_name() + ":" + std::to_string(::getpid());
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)),
            "[ddpstore] " + prefix + " listening\n[ddprun] " + prefix + " hello\n");
}

TEST(SysTest, TokenFileStripsOneNewlineAndJudgesThePath) {
  TempDir dir("ddprun-token-");
  auto write = [&](const std::string& name, const std::string& text, mode_t mode) {
    std::string path = dir.path() + "/" + name;
    UniqueFd f = open_for_write(path.c_str());
    write_all(f.get(), text.data(), text.size());
    ::chmod(path.c_str(), mode);
    return path;
  };
  TokenFile ok = read_token_file(write("ok", "s3cret\n\n", 0600));
  EXPECT_EQ(ok.token, "s3cret\n");  // one trailing newline only
  EXPECT_TRUE(ok.error.empty());
  EXPECT_TRUE(ok.warning.empty());
  const std::string shared = write("shared", "s3cret", 0644);
  TokenFile loose = read_token_file(shared);
  EXPECT_EQ(loose.token, "s3cret");
  EXPECT_EQ(loose.warning, "warning: the token file " + shared +
                               " can be read by other users (mode 0644); chmod 600 " + shared);
  const std::string writable = write("writable", "s3cret", 0666);
  TokenFile open_to_all = read_token_file(writable);
  EXPECT_EQ(open_to_all.error, "the token file " + writable +
                                   " can be changed by other users (mode 0666); chmod 600 " +
                                   writable);
  EXPECT_EQ(open_to_all.token, "");
  // A FIFO nobody writes to is refused at once, not waited on.
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(read_token_file(fifo).error, "the token file " + fifo + " is not a small regular file");
  const std::string empty = write("empty", "\n", 0600);
  EXPECT_EQ(read_token_file(empty).error, "the token file " + empty + " is empty");
  EXPECT_EQ(read_token_file(dir.path() + "/missing").error,
            "cannot read the token file " + dir.path() + "/missing: No such file or directory");
  EXPECT_EQ(read_token_file(dir.path()).error,
            "the token file " + dir.path() + " is not a small regular file");
}

TEST(SysTest, FindOnPathTakesTheFirstExecutableAndReadsEmptyEntriesAsAsked) {
  TempDir dir("ddprun_path_test");
  const std::string a = dir.path() + "/a", b = dir.path() + "/b";
  ::mkdir(a.c_str(), 0755);
  ::mkdir(b.c_str(), 0755);
  auto make = [](const std::string& path, mode_t mode) {
    UniqueFd fd(::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, mode));
    ASSERT_TRUE(fd);
  };
  make(a + "/tool", 0644);  // not executable: skipped
  make(b + "/tool", 0755);
  ::mkdir((a + "/dir").c_str(), 0755);  // a directory is no program
  make(b + "/dir", 0755);
  const std::string path = a + ":" + b;
  EXPECT_EQ(find_on_path("tool", path, EmptyEntry::kSkipped), b + "/tool");
  EXPECT_EQ(find_on_path("dir", path, EmptyEntry::kSkipped), b + "/dir");
  EXPECT_EQ(find_on_path("nothing", path, EmptyEntry::kSkipped), std::nullopt);
  EXPECT_EQ(find_on_path(b + "/tool", "", EmptyEntry::kSkipped), b + "/tool");  // not searched
  EXPECT_EQ(find_on_path(a + "/tool", path, EmptyEntry::kSkipped), std::nullopt);

  // An empty entry ("", a leading or trailing colon) is the current directory for execvp only.
  const std::string cwd = std::filesystem::current_path().string();
  std::filesystem::current_path(b);
  EXPECT_EQ(find_on_path("tool", a + ":", EmptyEntry::kCurrentDirectory), "./tool");
  EXPECT_EQ(find_on_path("tool", ":" + a, EmptyEntry::kCurrentDirectory), "./tool");
  EXPECT_EQ(find_on_path("tool", a + ":", EmptyEntry::kSkipped), std::nullopt);
  EXPECT_EQ(find_on_path("tool", "", EmptyEntry::kSkipped), std::nullopt);
  std::filesystem::current_path(cwd);
}

TEST(SysTest, SignalNamesBothWays) {
  EXPECT_EQ(signal_name(SIGKILL), "SIGKILL");
  EXPECT_EQ(signal_name(77), "SIGNAL 77");
  EXPECT_EQ(signal_number("SIGUSR1"), SIGUSR1);
  EXPECT_EQ(signal_number("TERM"), SIGTERM);
  EXPECT_EQ(signal_number("15"), 15);
  EXPECT_EQ(signal_number("0"), std::nullopt);
  EXPECT_EQ(signal_number("SIGNOPE"), std::nullopt);
}

}  // namespace
}  // namespace ddprun::sys
