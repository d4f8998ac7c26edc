#include "cli/plot.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace conveyor::cli {
namespace {

// The first of $CONVEYOR_PYTHON, python3 on the PATH and /usr/bin/python3
// (Debian's, with python3-matplotlib) that can import matplotlib.
std::string Python() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("CONVEYOR_PYTHON"); env && *env) candidates.push_back(env);
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  for (const auto& py : candidates) {
    pid_t pid = fork();
    if (pid == 0) {
      int null = open("/dev/null", O_WRONLY);
      if (null >= 0) {
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
      }
      execlp(py.c_str(), py.c_str(), "-c", "import matplotlib", static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) return py;
  }
  return "python3";
}

}  // namespace

Status RunPlotScript(const std::string& script, const char* env_override, const std::vector<std::string>& args) {
  std::string path = std::string(CONVEYOR_SOURCE_DIR) + "/cli/" + script;
  if (const char* env = std::getenv(env_override); env && *env) path = env;
  if (!std::filesystem::exists(path))
    return absl::NotFoundError(path + " not found (set " + std::string(env_override) + ")");
  const std::string python = Python();
  std::vector<char*> argv = {const_cast<char*>(python.c_str()), const_cast<char*>(path.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    execvp(python.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return absl::InternalError("the plot script failed (is python3-matplotlib installed?)");
  return absl::OkStatus();
}

}  // namespace conveyor::cli
