// The stack dumper's parsers (stack_dump.hpp), on output captured from the real tools: the
// main thread's head of eu-stack, gdb and py-spy output, and where a stack stands (in a
// collective or elsewhere).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agent/process/stack_dump.hpp"

namespace ddprun::agent {
namespace {

TEST(StackHeadTest, EuStackMainThreadBlock) {
  const char* text =
      "PID 26508 - process\n"
      "TID 26521:\n"
      "#0  0x00007f6b93549f16 __futex_abstimed_wait_common\n"
      "TID 26508:\n"
      "#0  0x00007f6b93593545 clock_nanosleep@GLIBC_2.2.5\n"
      "#1  0x00000000005d64b4\n"
      "#2  0x000000000053acbc PyObject_Vectorcall\n";
  auto head = native_stack_head(text, 26508);
  ASSERT_EQ(head.size(), 3u);
  EXPECT_EQ(head[0], "#0 clock_nanosleep@GLIBC_2.2.5");
  EXPECT_EQ(head[1], "#1 ??");
  EXPECT_EQ(head[2], "#2 PyObject_Vectorcall");
  // Another pid: the first block.
  EXPECT_EQ(native_stack_head(text, 1)[0], "#0 __futex_abstimed_wait_common");
}

TEST(StackHeadTest, GdbThreadOne) {
  const char* text =
      "[New LWP 26521]\n"
      "0x00007f6b93593545 in __GI___clock_nanosleep (clock_id=1) at x.c:48\n"
      "\n"
      "Thread 2 (Thread 0x7f6ade7ff6c0 (LWP 26521) \"python\"):\n"
      "#0  __futex_abstimed_wait_common64 (private=0, cancel=true) at ./nptl/futex-internal.c:57\n"
      "\n"
      "Thread 1 (Thread 0x7f6b934c3040 (LWP 26508) \"python\"):\n"
      "#0  0x00007f6b93593545 in __GI___clock_nanosleep (clock_id=1, flags=1) at c.c:48\n"
      "#1  0x00000000005d64b4 in ?? ()\n"
      "#2  0x000000000053acbc in PyObject_Vectorcall ()\n"
      "[Inferior 1 (process 26508) detached]\n";
  auto head = native_stack_head(text, 26508);
  ASSERT_EQ(head.size(), 3u);
  EXPECT_EQ(head[0], "#0 __GI___clock_nanosleep");
  EXPECT_EQ(head[1], "#1 ??");
  EXPECT_EQ(head[2], "#2 PyObject_Vectorcall");
  EXPECT_EQ(native_stack_head(text, 4242)[0], "#0 __GI___clock_nanosleep");  // Thread 1
}

TEST(StackHeadTest, PySpyMainThreadWhereverItIs) {
  const char* text =
      "Process 26508: python train.py\n"
      "Python v3.11.2 (/usr/bin/python3.11)\n"
      "\n"
      "Thread 26530 (idle): \"pin_memory\"\n"
      "    wait (threading.py:320)\n"
      "\n"
      "Thread 26508 (active): \"MainThread\"\n"
      "    stuck_in_python (train.py:2)\n"
      "        Arguments:\n"
      "            x: 1\n"
      "    <module> (train.py:3)\n";
  auto head = python_stack_head(text, 999);
  ASSERT_EQ(head.size(), 2u);
  EXPECT_EQ(head[0], "stuck_in_python (train.py:2)");
  EXPECT_EQ(head[1], "<module> (train.py:3)");
  // Without thread names (--nonblocking on some Pythons): the worker's own thread id.
  const char* unnamed = "Thread 7 (idle)\n    a (x.py:1)\nThread 8 (idle)\n    b (x.py:2)\n";
  EXPECT_EQ(python_stack_head(unnamed, 8), std::vector<std::string>{"b (x.py:2)"});
  EXPECT_EQ(python_stack_head(unnamed, 9), std::vector<std::string>{"a (x.py:1)"});
}

TEST(StackHeadTest, OddOutputGivesAnEmptyHead) {
  for (const char* text : {"", "\n\n", "Thread", "TID 5:", "Thread 1 (", "#0",
                           "Error: Failed to find python version\n   0: anyhow\n",
                           "TID 5:\n#0\n#1  0x\n#2  0x1 in \n"}) {
    EXPECT_LE(native_stack_head(text, 5).size(), kStackHeadLines) << text;
    EXPECT_TRUE(python_stack_head(text, 5).empty()) << text;
  }
  std::string many = "TID 5:\n";
  for (int i = 0; i < 50; ++i) {
    many += '#';  // (GCC 12 warns falsely about "#" + std::string)
    many += std::to_string(i) + "  0x1 " + std::string(500, 'f') + "\n";
  }
  auto head = native_stack_head(many, 5);
  ASSERT_EQ(head.size(), kStackHeadLines);
  EXPECT_LE(head[0].size(), 170u);
}

// Where the main thread is, for the collective judgement (real outputs: a torch 2.15 gloo
// worker waiting in all_reduce, one sleeping outside any collective).
TEST(StackPlaceTest, PythonFramesInDistributedC10dAreACollective) {
  const char* waiting =
      "Thread 23700 (idle): \"MainThread\"\n"
      "    all_reduce (torch/distributed/distributed_c10d.py:4181)\n"
      "    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)\n"
      "    main (skip_collective.py:48)\n"
      "    run (<ddprun-zygote>:350)\n";
  StackPlace p = stack_place("", waiting, 23700);
  EXPECT_EQ(p.where, StackPlace::Where::kInCollective);
  EXPECT_EQ(p.op, "all_reduce");
  EXPECT_EQ(p.frame, "all_reduce (torch/distributed/distributed_c10d.py:4181)");
  const char* elsewhere =
      "Thread 23701 (idle): \"MainThread\"\n"
      "    sleep_instead_of_the_collective (skip_collective.py:27)\n"
      "    main (skip_collective.py:46)\n";
  p = stack_place("TID 23701:\n#0  0x1 c10d::Work::wait\n", elsewhere, 23701);
  EXPECT_EQ(p.where, StackPlace::Where::kElsewhere);  // Python frames decide
  EXPECT_EQ(p.frame, "sleep_instead_of_the_collective (skip_collective.py:27)");
  // The zygote's own frames are not the script's.
  EXPECT_EQ(python_stack_head(waiting, 23700).size(), 3u);
}

TEST(StackPlaceTest, NativeC10dFramesAreACollective) {
  const char* waiting =
      "TID 23700:\n"
      "#0  0x00007f2be9a81f16 __futex_abstimed_wait_common\n"
      "#1  0x00007f2be9a845d8 pthread_cond_wait@@GLIBC_2.3.2\n"
      "#2  0x00007f2be84a741d std::condition_variable::wait(std::unique_lock<std::mutex>&)\n"
      "#3  0x00007f2b5dbe9d9b c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, "
      "1000l> >)\n"
      "#4  0x00007f2b6cc106c5 pybind11::cpp_function::dispatcher(_object*)\n";
  StackPlace p = stack_place(waiting, "", 23700);
  EXPECT_EQ(p.where, StackPlace::Where::kInCollective);
  EXPECT_TRUE(p.op.empty());
  EXPECT_EQ(p.frame.rfind("#3 c10d::Work::wait", 0), 0u) << p.frame;
  const char* sleeping =
      "TID 23701:\n"
      "#0  0x00007eff83be6545 clock_nanosleep@GLIBC_2.2.5\n"
      "#1  0x00000000005d64b4\n"
      "#2  0x000000000053acbc PyObject_Vectorcall\n";
  p = stack_place(sleeping, "", 23701);
  EXPECT_EQ(p.where, StackPlace::Where::kElsewhere);
  EXPECT_EQ(p.frame, "#0 clock_nanosleep@GLIBC_2.2.5");
  EXPECT_EQ(stack_place("", "", 1).where, StackPlace::Where::kUnknown);
}

}  // namespace
}  // namespace ddprun::agent
