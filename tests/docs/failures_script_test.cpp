// scripts/failures.sh, which test.sh and sanitize.sh run after a failed
// ctest: over a LastTest.log of ctest's format, it repeats each failed test's
// GoogleTest failures (or, for a test with none, its last lines) and nothing
// of the tests that passed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "block_runner.h"

namespace docs {
namespace {

namespace fs = std::filesystem;

// One test's block of LastTest.log, as ctest writes it.
std::string Block(int index, const std::string& name, const std::string& output, bool passed) {
  return std::to_string(index) + "/3 Testing: " + name + "\n" + std::to_string(index) + "/3 Test: " + name +
         "\nCommand: \"/bin/true\"\nDirectory: /b\n\"" + name +
         "\" start time: Nov 29 14:59 UTC\nOutput:\n----------------------------------------------------------\n" +
         output + "<end of output>\nTest time =   0.03 sec\n----------------------------------------------------------\n" +
         (passed ? "Test Passed.\n" : "Test Failed.\n") + "\"" + name + "\" end time: Nov 29 14:59 UTC\n\n";
}

TEST(FailuresScript, RepeatsTheFailuresOfTheFailedTestsAlone) {
  const fs::path build = fs::path(::testing::TempDir()) / "failures_script_test";
  const fs::path logs = build / "Testing" / "Temporary";
  fs::create_directories(logs);
  std::string noise;
  for (int i = 0; i < 50; ++i) noise += "2026-11-29 14:52:23.515 I [conveyor] job job-1 step " + std::to_string(i) + "\n";
  std::ofstream(logs / "LastTest.log")
      << "Start testing: Nov 29 14:59 UTC\n----------------------------------------------------------\n"
      << Block(1, "Coordinator.*",
               "[ RUN      ] Coordinator.Runs\n" + noise +
                   "coordinator_test.cpp:57: Failure\nExpected equality of these values:\n  s.step()\n    Which is: 4\n"
                   "  5\n" + noise + "[  FAILED  ] Coordinator.Runs (51 ms)\n",
               false)
      << Block(2, "Quiet.*", "passed-test-line\n", true)
      << Block(3, "deploy.slurm", noise + "the script's last words\n", false) << "End testing: Nov 29 14:59 UTC\n";
  std::ofstream(logs / "LastTestsFailed.log") << "1:Coordinator.*\n3:deploy.slurm\n";
  std::string out;
  ASSERT_EQ(RunQuiet({"/bin/bash", std::string(CONVEYOR_SOURCE_DIR) + "/scripts/failures.sh", build.string()}, &out), 0)
      << out;
  EXPECT_NE(out.find("--- Coordinator.*\ncoordinator_test.cpp:57: Failure\nExpected equality"), std::string::npos) << out;
  EXPECT_NE(out.find("Which is: 4"), std::string::npos) << out;
  EXPECT_NE(out.find("[  FAILED  ] Coordinator.Runs (51 ms)"), std::string::npos) << out;
  EXPECT_NE(out.find("--- deploy.slurm\n"), std::string::npos) << out;
  EXPECT_NE(out.find("the script's last words"), std::string::npos) << out;
  EXPECT_EQ(out.find("passed-test-line"), std::string::npos) << out;
  EXPECT_EQ(out.find("step 0\n"), std::string::npos) << "a failed test's whole output: " << out;
  // A run with no failure: nothing.
  fs::remove(logs / "LastTestsFailed.log");
  out.clear();
  ASSERT_EQ(RunQuiet({"/bin/bash", std::string(CONVEYOR_SOURCE_DIR) + "/scripts/failures.sh", build.string()}, &out), 0);
  EXPECT_EQ(out, "");
  fs::remove(logs / "LastTest.log");
  fs::remove(logs);
  fs::remove(build / "Testing");
  fs::remove(build);
}

}  // namespace
}  // namespace docs
