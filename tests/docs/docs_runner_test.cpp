// DocsRunner: how a block runs (block_runner.h): strict mode, its folder, its
// namespaces, its timeout, and what it leaves running stopped.
#include <gtest/gtest.h>

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>

#include "block_runner.h"

namespace docs::runner_test {

using std::chrono::milliseconds;

RunOptions Quick() {
  RunOptions o;
  o.timeout = milliseconds(60000);
  o.grace = milliseconds(1000);
  return o;
}

TEST(DocsRunner, FailureGivesExitCodeAndOutput) {
  const RunResult r = RunBlock("echo before\necho to-stderr >&2\nfalse\necho after\n", Quick());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.output.find("before"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("to-stderr"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("after"), std::string::npos) << r.output;
}

TEST(DocsRunner, StrictMode) {
  EXPECT_NE(RunBlock("false | true\n", Quick()).exit_code, 0);  // pipefail
  const RunResult unset = RunBlock("echo \"$DOCS_TEST_NOT_SET\"\n", Quick());  // nounset
  EXPECT_NE(unset.exit_code, 0);
  EXPECT_NE(unset.output.find("line 1: DOCS_TEST_NOT_SET: unbound variable"), std::string::npos) << unset.output;
  EXPECT_EQ(RunBlock("true\n", Quick()).exit_code, 0);
  EXPECT_EQ(RunBlock("exit 3\n", Quick()).exit_code, 3);
  EXPECT_EQ(RunBlock("cat\n", Quick()).exit_code, 0);  // stdin is /dev/null
}

TEST(DocsRunner, Folder) {
  setenv("CONVEYOR_COORDINATOR", "127.0.0.1:1", 1);
  const RunResult r = RunBlock(
      "[ \"$HOME\" = \"$PWD\" ]\n"
      "[ -z \"${CONVEYOR_COORDINATOR+set}\" ]\n"
      "[ -L README.md ] && [ -L examples ] && [ -f examples/toy.yaml ]\n"
      "[ \"$(readlink build)\" = \"" CONVEYOR_BUILD_DIR "\" ]\n"
      "[ \"$(readlink examples)\" = \"" CONVEYOR_SOURCE_DIR "/examples\" ]\n"
      "case \":$PATH:\" in \":$PWD/build/bin:\"*) ;; *) exit 9 ;; esac\n"
      "touch mine && [ -f mine ] && [ ! -e \"" CONVEYOR_SOURCE_DIR "/mine\" ]\n",
      Quick());
  unsetenv("CONVEYOR_COORDINATOR");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(DocsRunner, StopsWhatTheBlockLeavesRunning) {
  // A server left in the background, one that ignores SIGTERM and one that left
  // the block's process group; each says through a FIFO when it is in place.
  const RunResult r = RunBlock(
      "mkfifo r1 r2 r3\n"
      "bash -c 'echo >r1; exec sleep infinity' &\necho \"pid $!\"; read -r <r1\n"
      "bash -c 'trap \"\" TERM; echo >r2; exec sleep infinity' &\necho \"pid $!\"; read -r <r2\n"
      "setsid bash -c 'echo >r3; exec sleep infinity' &\necho \"pid $!\"; read -r <r3\n",
      Quick());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(r.needed_kill);
  EXPECT_TRUE(r.survivors.empty());
  std::istringstream out(r.output);
  int pids = 0;
  for (std::string word; out >> word;) {
    if (word != "pid") continue;
    pid_t pid = 0;
    out >> pid;
    ++pids;
    errno = 0;
    EXPECT_EQ(kill(pid, 0), -1) << "process " << pid << " still there";  // reaped by us: not even a zombie
    EXPECT_EQ(errno, ESRCH);
  }
  EXPECT_EQ(pids, 3) << r.output;
}

TEST(DocsRunner, Timeout) {
  RunOptions o = Quick();
  o.timeout = milliseconds(1000);
  const RunResult r = RunBlock("echo started\nsleep infinity\n", o);
  EXPECT_TRUE(r.timed_out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("started"), std::string::npos) << r.output;
  EXPECT_TRUE(r.survivors.empty());
  EXPECT_LT(r.seconds, 30);
}

TEST(DocsRunner, PrivateNetworkAndTmp) {
  const Isolation& iso = GetIsolation();
  if (iso.prefix.empty()) GTEST_SKIP() << iso.description;
  const RunResult r = RunBlock(
      "[ \"$(ip -o link show | wc -l)\" = 1 ]\n"
      "ip -o link show lo | grep -q ',UP'\n" +
          std::string(iso.private_tmp ? "[ -z \"$(ls -A /tmp | grep -vx -e docs-block -e '" + TmpTop() +
                                            "')\" ] && [ \"$PWD\" = /tmp/docs-block ] && [ ! -e /tmp/conveyor ]\n"
                                      : ""),
      Quick());
  EXPECT_EQ(r.exit_code, 0) << iso.description << "\n" << r.output;
}

}  // namespace docs::runner_test
