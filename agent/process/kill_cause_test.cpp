// KillCauses: the kernel log's OOM lines as this kernel writes them, /proc/<pid>/cgroup of v1,
// v2 and hybrid machines, and real processes killed with SIGKILL: from outside, by "ddprun",
// and "by the OOM killer" as a memory cgroup's oom_kill count tells it (a cgroup tree made in
// a temp directory, since a real OOM kill is tests/diagnose/test_oom.py's).
#include "agent/process/kill_cause.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "store/sys/temp_dir.hpp"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;

TEST(KillCauseParse, TheOomKillersTwoLines) {
  std::map<pid_t, OomKillRecord> kills;
  EXPECT_TRUE(parse_oom_log_line(
      "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
      "oom_memcg=/ddprun_probe,task_memcg=/ddprun_probe,task=python3,pid=31619,uid=0",
      kills));
  EXPECT_TRUE(parse_oom_log_line(
      "Memory cgroup out of memory: Killed process 31619 (python3) total-vm:323772kB, "
      "anon-rss:108928kB, file-rss:6636kB, shmem-rss:0kB, UID:0 pgtables:284kB oom_score_adj:0",
      kills));
  ASSERT_EQ(kills.count(31619), 1u);
  EXPECT_EQ(kills[31619].rss_kb, 108928u + 6636u);
  EXPECT_EQ(kills[31619].memcg, "/ddprun_probe");

  // The node's memory ran out: no cgroup is named.
  EXPECT_TRUE(parse_oom_log_line(
      "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
      "global_oom,task_memcg=/user.slice,task=train,pid=77,uid=1000",
      kills));
  EXPECT_TRUE(
      parse_oom_log_line("Out of memory: Killed process 77 (train) total-vm:1kB, "
                         "anon-rss:2048kB, file-rss:0kB, shmem-rss:0kB",
                         kills));
  EXPECT_EQ(kills[77].memcg, "");
  EXPECT_EQ(kills[77].rss_kb, 2048u);

  EXPECT_FALSE(parse_oom_log_line("python3 invoked oom-killer: gfp_mask=0xcc0", kills));
  EXPECT_FALSE(parse_oom_log_line("Killed process x", kills));
  EXPECT_FALSE(parse_oom_log_line("oom-kill:task=python3", kills));
  EXPECT_EQ(kills.size(), 2u);
}

TEST(KillCauseParse, ProcCgroup) {
  CgroupRef v1 = parse_proc_cgroup(
      "9:name=systemd:/\n5:devices:/\n4:memory:/process_api/0124\n2:cpu,cpuacct:/\n0::/\n");
  EXPECT_EQ(v1.version, 1);
  EXPECT_EQ(v1.path, "/process_api/0124");
  CgroupRef v2 = parse_proc_cgroup("0::/user.slice/job.scope\n");
  EXPECT_EQ(v2.version, 2);
  EXPECT_EQ(v2.path, "/user.slice/job.scope");
  EXPECT_EQ(parse_proc_cgroup("3:cpu,memory,pids:/a\n").path, "/a");
  EXPECT_EQ(parse_proc_cgroup("").version, 0);
  EXPECT_EQ(parse_proc_cgroup("garbage\n1:cpu\n").version, 0);
}

TEST(KillCauseParse, Bytes) {
  EXPECT_EQ(format_bytes(512 * 1024), "512 KiB");
  EXPECT_EQ(format_bytes(uint64_t{84} << 20), "84.0 MiB");
  EXPECT_EQ(format_bytes((uint64_t{45} << 30) + (uint64_t{100} << 20)), "45.1 GiB");
}

// A child that sleeps until killed.
pid_t sleeper() {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::pause();
    ::_exit(0);
  }
  return pid;
}

void reap_killed(pid_t pid) {  // SIGKILL, and wait until it is a zombie
  ::kill(pid, SIGKILL);
  siginfo_t info{};
  ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT);
}

TEST(KillCauses, ASigkillFromOutside) {
  KillCauses causes;
  pid_t pid = sleeper();
  causes.started(pid);
  reap_killed(pid);
  ::waitpid(pid, nullptr, 0);
  std::string cause = causes.explain(pid, "", 2048);
  EXPECT_NE(cause.find("killed by SIGKILL from outside ddprun"), std::string::npos) << cause;
  EXPECT_NE(cause.find("peak rss 2.0 MiB"), std::string::npos) << cause;
  EXPECT_EQ(cause.find("killed by the kernel's OOM killer"), std::string::npos) << cause;
}

TEST(KillCauses, ASigkillDdprunSent) {
  KillCauses causes;
  pid_t pid = sleeper();
  causes.started(pid);
  reap_killed(pid);
  ::waitpid(pid, nullptr, 0);
  EXPECT_EQ(causes.explain(pid, "after its stop grace of 30 s expired", 0),
            "killed by ddprun: SIGKILL after its stop grace of 30 s expired");
}

// The process's memory cgroup, mirrored in a temp directory as if it were the mount: its
// oom_kill count rises while the worker dies of SIGKILL.
TEST(KillCauses, TheCgroupsOomKillCountRose) {
  std::ifstream self("/proc/self/cgroup");
  std::string text((std::istreambuf_iterator<char>(self)), std::istreambuf_iterator<char>());
  CgroupRef cg = parse_proc_cgroup(text);
  if (cg.version == 0) GTEST_SKIP() << "no memory cgroup on this machine";
  sys::TempDir root("ddprun_kill_cause_test");
  fs::path dir =
      fs::path(root.path()) / (cg.version == 1 ? "memory" : "") / fs::path(cg.path).relative_path();
  fs::create_directories(dir);
  auto write = [&](const char* file, const std::string& content) {
    std::ofstream(dir / file) << content;
  };
  const char* counts = cg.version == 1 ? "memory.oom_control" : "memory.events";
  const char* limit = cg.version == 1 ? "memory.limit_in_bytes" : "memory.max";
  write(counts, "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
  write(limit, std::to_string(uint64_t{100} << 20) + "\n");

  KillCauses causes(root.path());
  pid_t pid = sleeper();
  causes.started(pid);
  write(counts, "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n");
  reap_killed(pid);
  ::waitpid(pid, nullptr, 0);
  std::string cause = causes.explain(pid, "", 4096);
  EXPECT_EQ(cause.rfind("killed by the kernel's OOM killer (peak rss 4.0 MiB; memory cgroup " +
                            cg.path + " at its limit of 100.0 MiB; node ",
                        0),
            0u)
      << cause;
  EXPECT_NE(cause.find(" GiB in use)"), std::string::npos) << cause;

  // The count did not move for the next one: not the OOM killer.
  pid = sleeper();
  causes.started(pid);
  reap_killed(pid);
  ::waitpid(pid, nullptr, 0);
  cause = causes.explain(pid, "", 0);
  EXPECT_EQ(cause.find("killed by the kernel's OOM killer"), std::string::npos) << cause;
}

TEST(KillCauses, ProcessMemory) {
  auto m = read_process_memory(::getpid());
  ASSERT_TRUE(m);
  EXPECT_GT(m->rss_kb, 0u);
  EXPECT_GE(m->peak_rss_kb, m->rss_kb);
  EXPECT_FALSE(read_process_memory(-1));
}

}  // namespace
}  // namespace ddprun::agent
