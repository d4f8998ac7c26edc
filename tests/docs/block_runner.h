// Runs one shell block as docs_test.cpp's opening comment describes: bash in
// strict mode, in a folder of links to the source tree, in private network and
// /tmp namespaces where it may; whatever the block leaves running is stopped
// and reaped. RunQuiet runs a short command of the test's own.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "tree_paths.h"

namespace docs {

struct Isolation {
  std::vector<std::string> prefix;  // unshare ... --, or nothing
  bool private_tmp = false;
  std::string description;          // for the log
};

// Runs argv with output captured; for short set-up commands only.
int RunQuiet(const std::vector<std::string>& argv, std::string* output);

// The folder directly in /tmp that holds the clone, where it lies under /tmp
// (the private /tmp shows it, bound back in); "docs-block" otherwise.
std::string TmpTop();

// How blocks run here (probed once).
const Isolation& GetIsolation();

struct RunOptions {
  std::chrono::milliseconds timeout{300000};
  std::chrono::milliseconds grace{10000};  // between SIGTERM and SIGKILL for what the block leaves running
};

// The defaults, with CONVEYOR_DOCS_TEST_TIMEOUT.
RunOptions DefaultOptions();

struct RunResult {
  int exit_code = -1;  // bash's; 128 + N when a signal N ended it
  bool timed_out = false;
  double seconds = 0;
  std::string output;  // stdout and stderr, interleaved
  std::string isolation;
  int left_running = 0;   // processes still running when the block ended, stopped
  bool needed_kill = false;
  std::vector<pid_t> survivors;  // still there after SIGKILL (never expected)
};

// `name` is bash's $0: its messages then read "README.md:75: line 3: ...".
RunResult RunBlock(const std::string& block, RunOptions options = DefaultOptions(),
                   const std::string& name = "docs-block");

}  // namespace docs
