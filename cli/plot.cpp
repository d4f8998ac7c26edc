#include "cli/plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace conveyor::cli {
namespace {

// The plot scripts' exit code where the python3 running them cannot import
// matplotlib (cli/plot_*.py).
constexpr int kNoMatplotlib = 3;

// $CONVEYOR_PYTHON, python3 on the PATH and /usr/bin/python3 (Debian's, with
// python3-matplotlib), in the order they are tried.
std::vector<std::string> Pythons() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("CONVEYOR_PYTHON"); env && *env) candidates.push_back(env);
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  return candidates;
}

// `python` running argv[1..]; its exit code, 127 where it could not start.
int RunUnder(const std::string& python, std::vector<char*> argv) {
  argv[0] = const_cast<char*>(python.c_str());
  pid_t pid = fork();
  if (pid == 0) {
    execvp(python.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace

// The script itself finds out whether a python3 has matplotlib (exit code
// kNoMatplotlib), so that a picture starts one interpreter, not a probe
// first: each costs about 0.4 s of CPU.
Status RunPlotScript(const std::string& script, const char* env_override, const std::vector<std::string>& args) {
  std::string path = std::string(CONVEYOR_SOURCE_DIR) + "/cli/" + script;
  if (const char* env = std::getenv(env_override); env && *env) path = env;
  if (!std::filesystem::exists(path))
    return absl::NotFoundError(path + " not found (set " + std::string(env_override) + ")");
  std::vector<char*> argv = {nullptr, const_cast<char*>(path.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::string tried;
  for (const std::string& python : Pythons()) {
    const int rc = RunUnder(python, argv);
    if (rc == 0) return absl::OkStatus();
    if (rc != kNoMatplotlib && rc != 127)
      return absl::InternalError("the plot script " + path + " failed under " + python + " (exit code " +
                                 std::to_string(rc) + ")");
    tried += (tried.empty() ? "" : ", ") + python;
  }
  return absl::FailedPreconditionError("no python3 that can import matplotlib (tried " + tried +
                                       "): install python3-matplotlib, or set CONVEYOR_PYTHON to one that has it");
}

}  // namespace conveyor::cli
