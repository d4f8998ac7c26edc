// How a picture finds a python3 with matplotlib (cli/plot.cpp): the plot
// script itself says it has none (exit code 3), so each candidate costs one
// interpreter start, and none at all gives an error that says what to install.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "cli/plot.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;

// A plot script that appends a line to its first argument and exits with a code of the test's.
class PlotScript : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("/usr/bin/python3 -c '' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no /usr/bin/python3";
    std::string tmpl = (fs::path(::testing::TempDir()) / "plot_script_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    log_ = dir_ / "starts.txt";
  }
  void TearDown() override {
    unsetenv("CONVEYOR_CURVES_SCRIPT");
    if (dir_.empty()) return;  // skipped
    // Its two files, then the folder: no folder walk (SourceTree.NoStdFilesystemFolderWalks).
    fs::remove(dir_ / "plot.py");
    fs::remove(log_);
    fs::remove(dir_);
  }
  // RunPlotScript over a script that exits `rc`, $CONVEYOR_PYTHON set to
  // /usr/bin/python3 (so that every machine tries two or three).
  Status DrawWithScriptExiting(int rc) {
    const fs::path script = dir_ / "plot.py";
    std::ofstream(script) << "import sys\nopen(sys.argv[1], 'a').write('started\\n')\nsys.exit(" << rc << ")\n";
    setenv("CONVEYOR_CURVES_SCRIPT", script.c_str(), 1);
    setenv("CONVEYOR_PYTHON", "/usr/bin/python3", 1);
    Status drawn = RunPlotScript("plot_curves.py", "CONVEYOR_CURVES_SCRIPT", {log_.string()});
    unsetenv("CONVEYOR_PYTHON");
    return drawn;
  }
  int Starts() const {
    std::ifstream in(log_);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  }
  fs::path dir_, log_;
};

TEST_F(PlotScript, AScriptThatDrawsItsPictureRunsOnce) {
  Status drawn = DrawWithScriptExiting(0);
  ASSERT_TRUE(drawn.ok()) << drawn;
  EXPECT_EQ(Starts(), 1) << "the script run again under another python3";
}

TEST_F(PlotScript, EveryPythonWithoutMatplotlibIsTriedAndTheErrorSaysWhatToInstall) {
  Status drawn = DrawWithScriptExiting(3);
  EXPECT_EQ(drawn.code(), absl::StatusCode::kFailedPrecondition) << drawn;
  EXPECT_NE(drawn.message().find("install python3-matplotlib"), std::string::npos) << drawn;
  EXPECT_NE(drawn.message().find("/usr/bin/python3"), std::string::npos) << drawn;
  // $CONVEYOR_PYTHON and /usr/bin/python3, and python3 on the PATH where there is one.
  EXPECT_GE(Starts(), 2);
  EXPECT_LE(Starts(), 3);
}

TEST_F(PlotScript, AScriptThatFailsOtherwiseIsNotRunAgainUnderAnotherPython) {
  Status drawn = DrawWithScriptExiting(1);
  EXPECT_EQ(drawn.code(), absl::StatusCode::kInternal) << drawn;
  EXPECT_NE(drawn.message().find("exit code 1"), std::string::npos) << drawn;
  EXPECT_EQ(Starts(), 1);
}

}  // namespace
}  // namespace conveyor::cli
