// Running a block (block_runner.h).
#include "block_runner.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "doc_blocks.h"

extern char** environ;

namespace docs {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

bool UnderTmp(const std::string& path) {
  std::error_code ec;
  const std::string real = fs::weakly_canonical(path, ec).string();
  return real == "/tmp" || real.rfind("/tmp/", 0) == 0;
}

// The processes whose parent is this one (orphans come back to us: we are a subreaper).
std::vector<pid_t> Children(bool running_only = false) {
  std::vector<pid_t> kids;
  const pid_t self = getpid();
  DIR* proc = opendir("/proc");
  if (!proc) return kids;
  while (dirent* e = readdir(proc)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    // read(2), not a stream: a process that exits between the open and the
    // read fails the read with ESRCH, which libstdc++'s stream buffer throws
    // ("basic_filebuf::underflow error reading the file: No such process").
    const int fd = open((std::string("/proc/") + e->d_name + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buf[1024];
    const ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (n <= 0) continue;  // gone
    const std::string s(buf, static_cast<std::size_t>(n));
    const auto close_paren = s.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream rest(s.substr(close_paren + 1));
    char state;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == self && (!running_only || state != 'Z')) kids.push_back(static_cast<pid_t>(std::atol(e->d_name)));
  }
  closedir(proc);
  return kids;
}

// The runner: sets up the block's folder (inside the namespaces, if any) and
// execs the block. $1 outer folder, $2 source tree, $3 build folder,
// $4 private (network and /tmp) | netns (network only) | plain, $5 the block's name.
constexpr const char* kRunner = R"RUNNER(set -eu
d=$1 src=$2 build=$3 mode=$4 name=$5
script=$(cat "$d/block.sh")
if [ "$mode" = private ]; then
  ip link set lo up
  # A clone (or build) under /tmp is bound back into the private /tmp, through
  # a mount point that exists only in this mount namespace.
  keep=""
  case "$src/|$build/" in /tmp/*|*"|/tmp/"*) keep=1 ;; esac
  if [ -n "$keep" ]; then
    mount -t tmpfs docs-keep /mnt
    mkdir /mnt/src /mnt/build
    mount --bind "$src" /mnt/src
    mount --bind "$build" /mnt/build
  fi
  mount -t tmpfs -o mode=1777 docs-test /tmp
  if [ -n "$keep" ]; then
    mkdir -p "$src"
    mount --bind /mnt/src "$src"
    mkdir -p "$build"
    mount --bind /mnt/build "$build"
  fi
  export TMPDIR=/tmp
  work=/tmp/docs-block
elif [ "$mode" = netns ]; then
  ip link set lo up
  work=$d/work
else
  work=$d/work
fi
mkdir "$work"
for e in "$src"/* "$src"/.[!.]* "$src"/..?*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  [ "${e##*/}" = build ] && continue
  ln -s "$e" "$work/${e##*/}"
done
ln -s "$build" "$work/build"
cd "$work"
export HOME="$work" PATH="$work/build/bin:$PATH"
exec bash -c "$script" "$name" </dev/null
)RUNNER";

// The block's own first line carries this, so bash's "line N" is the block's line N.
constexpr const char* kPrelude =
    "set -euo pipefail; trap '__docs_test_jobs=$(jobs -p); "
    "[ -z \"$__docs_test_jobs\" ] || kill $__docs_test_jobs 2>/dev/null || true' EXIT; ";

class Runner {
 public:
  explicit Runner(RunOptions options) : options_(options) {}

  RunResult Run(const std::string& block, const std::string& name) {
    RunResult result;
    const Isolation& iso = GetIsolation();
    result.isolation = iso.description;
    const auto start = Clock::now();

    std::string tmpl = (fs::temp_directory_path() / "conveyor-docs-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) {
      result.output = std::string("mkdtemp: ") + std::strerror(errno);
      return result;
    }
    const std::string dir = tmpl;
    {
      std::ofstream script(dir + "/block.sh");
      script << kPrelude << block;
    }

    std::vector<std::string> argv = iso.prefix;
    const std::string mode = iso.private_tmp ? "private" : (iso.prefix.empty() ? "plain" : "netns");
    argv.insert(argv.end(), {"bash", "-c", kRunner, "docs-runner", dir, CONVEYOR_SOURCE_DIR,
                             CONVEYOR_BUILD_DIR, mode, name});

    prctl(PR_SET_CHILD_SUBREAPER, 1);
    sigset_t chld, old;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, &old);
    sigfd_ = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    int fds[2];
    if (sigfd_ < 0 || pipe2(fds, O_CLOEXEC) != 0) {
      result.output = std::string("signalfd/pipe: ") + std::strerror(errno);
      sigprocmask(SIG_SETMASK, &old, nullptr);
      return result;
    }
    out_ = fds[0];
    fcntl(out_, F_SETFL, O_NONBLOCK);

    const pid_t pid = Spawn(argv, fds[1], old, &result.output);
    output_ = &result.output;

    int status = 0;
    bool done = pid < 0;
    if (!done) done = AwaitBlock(pid, start + options_.timeout, &status, &result);
    if (pid > 0) StopLeftovers(pid, &done, &status, &result);
    if (out_ >= 0) close(out_);
    close(sigfd_);
    sigprocmask(SIG_SETMASK, &old, nullptr);
    out_ = sigfd_ = -1;

    if (done && pid > 0) result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::error_code ec;
    fs::remove_all(dir, ec);  // symbolic links are removed, not followed
    return result;
  }

 private:
  // Forks the runner in a session and process group of its own, its output
  // into `out_write`, without CONVEYOR_* variables; -1 (and why, in *error)
  // where it cannot.
  pid_t Spawn(const std::vector<std::string>& argv, int out_write, const sigset_t& old, std::string* error) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> env_store;
    for (char** e = environ; *e; ++e) {
      if (std::strncmp(*e, "CONVEYOR_", 9) != 0) env_store.push_back(*e);
    }
    std::vector<char*> env;
    for (auto& e : env_store) env.push_back(e.data());
    env.push_back(nullptr);

    const pid_t pid = fork();
    if (pid < 0) {
      *error = std::string("fork: ") + std::strerror(errno);
      close(out_write);
    } else if (pid == 0) {
      setsid();  // its own session and process group: pgid == pid
      dup2(out_write, 1);
      dup2(out_write, 2);
      const int null = open("/dev/null", O_RDONLY);
      if (null >= 0) dup2(null, 0);
      sigprocmask(SIG_SETMASK, &old, nullptr);
      execvpe(args[0], args.data(), env.data());
      const char msg[] = "docs_test: cannot exec the runner\n";
      (void)!write(2, msg, sizeof msg - 1);
      _exit(127);
    }
    if (pid > 0) close(out_write);
    return pid;
  }

  // Waits for the block (the group leader) to end, or for the deadline; true
  // once it has ended, with its status.
  bool AwaitBlock(pid_t pid, Clock::time_point deadline, int* status, RunResult* result) {
    for (;;) {
      if (Clock::now() >= deadline) {
        result->timed_out = true;
        return false;
      }
      Wait(deadline);
      if (Reap(pid, status)) return true;
    }
  }

  // Stops what is still running: the block's group, and orphans that left it;
  // SIGTERM, then SIGKILL after the grace period, until all are reaped. Then
  // reads what output is left.
  void StopLeftovers(pid_t pid, bool* done, int* status, RunResult* result) {
    std::set<pid_t> signalled;
    auto signal_all = [&](int sig, bool again) {
      if (pid > 0) kill(-pid, sig);
      for (pid_t c : Children()) {
        if (again || signalled.insert(c).second) kill(c, sig);
      }
    };
    result->left_running = static_cast<int>(Children(true).size()) - (*done ? 0 : 1);
    signal_all(SIGTERM, false);
    const auto kill_at = Clock::now() + options_.grace;
    const auto give_up = kill_at + milliseconds(10000);
    bool killed = false;
    for (;;) {
      if (!*done) *done = Reap(pid, status);
      else Reap(-1, nullptr);
      siginfo_t info{};
      if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) < 0 && errno == ECHILD) break;  // all reaped
      const auto now = Clock::now();
      if (!killed && now >= kill_at) {
        killed = true;
        result->needed_kill = true;
        signal_all(SIGKILL, true);
      } else if (killed && now >= give_up) {
        result->survivors = Children();
        break;
      } else if (!killed) {
        signal_all(SIGTERM, false);  // orphans that came back since
      } else {
        signal_all(SIGKILL, true);
      }
      Wait(killed ? give_up : kill_at);
    }
    // What held the pipe is gone: read what is left (bounded, should a survivor hold it).
    const auto drained = Clock::now() + milliseconds(2000);
    while (out_ >= 0 && Drain() && Clock::now() < drained) {
      pollfd p = {out_, POLLIN, 0};
      poll(&p, 1, static_cast<int>(std::chrono::duration_cast<milliseconds>(drained - Clock::now()).count()));
    }
  }

  // Reaps what has ended; true once `pid` has, with its status.
  bool Reap(pid_t pid, int* status) {
    bool got = false;
    for (;;) {
      int st = 0;
      const pid_t r = waitpid(-1, &st, WNOHANG);
      if (r <= 0) break;
      if (r == pid && status) {
        *status = st;
        got = true;
      }
    }
    return got;
  }

  // Reads available output; false at end of file.
  bool Drain() {
    char buf[65536];
    for (;;) {
      const ssize_t r = read(out_, buf, sizeof buf);
      if (r > 0) {
        if (output_->size() < (8u << 20)) output_->append(buf, static_cast<size_t>(r));
        continue;
      }
      if (r == 0) {
        close(out_);
        out_ = -1;
        return false;
      }
      if (errno == EINTR) continue;
      return errno == EAGAIN;
    }
  }

  // Waits for output, a child's end, or the deadline.
  void Wait(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    pollfd p[2] = {{sigfd_, POLLIN, 0}, {out_, POLLIN, 0}};
    const int ms = static_cast<int>(std::clamp<long long>(left, 0, 60000));
    const int n = poll(p, out_ >= 0 ? 2 : 1, ms);
    if (n <= 0) return;
    if (p[0].revents) {
      signalfd_siginfo info;
      while (read(sigfd_, &info, sizeof info) == sizeof info) {
      }
    }
    if (out_ >= 0 && p[1].revents) Drain();
  }

  RunOptions options_;
  int sigfd_ = -1, out_ = -1;
  std::string* output_ = nullptr;
};

}  // namespace

int RunQuiet(const std::vector<std::string>& argv, std::string* output) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    const int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  char buf[4096];
  for (ssize_t r; (r = read(fds[0], buf, sizeof buf)) != 0;) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    output->append(buf, static_cast<size_t>(r));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string TmpTop() {
  if (!UnderTmp(CONVEYOR_SOURCE_DIR)) return "docs-block";
  std::error_code ec;
  const std::string real = fs::weakly_canonical(CONVEYOR_SOURCE_DIR, ec).string();
  const std::string rest = real.substr(5);
  return rest.substr(0, rest.find('/'));
}

const Isolation& GetIsolation() {
  static const Isolation isolation = [] {
    Isolation iso;
    const char* forced = std::getenv("CONVEYOR_DOCS_TEST_ISOLATION");
    if (forced && std::string(forced) == "none") {
      iso.description = "the host's network namespace and /tmp (CONVEYOR_DOCS_TEST_ISOLATION=none), where the "
                        "docs' fixed ports may collide with other programs";
      return iso;
    }
    std::vector<std::string> prefix = {"unshare"};
    if (geteuid() != 0) prefix.insert(prefix.end(), {"--user", "--map-root-user"});
    prefix.insert(prefix.end(), {"--net", "--mount", "--propagation", "private", "--"});
    // A clone under /tmp gets a private /tmp too: the runner binds it back in.
    iso.private_tmp = true;
    std::vector<std::string> probe = prefix;
    probe.insert(probe.end(), {"bash", "-c",
                               "ip link set lo up && mount -t tmpfs docs-keep /mnt && mount --bind /mnt /mnt && "
                               "mount -t tmpfs -o mode=1777 docs-test /tmp"});
    std::string out;
    const int rc = RunQuiet(probe, &out);
    if (rc != 0) {
      iso.private_tmp = false;
      iso.description = "the host's network namespace and /tmp, where the docs' fixed ports may collide with "
                        "other programs: `unshare" + std::string(geteuid() != 0 ? " --user" : "") +
                        " --net --mount` is not permitted here (" + Trim(out) + ")";
      return iso;
    }
    iso.prefix = prefix;
    iso.description = std::string("a private network namespace (loopback only)") +
                      (geteuid() != 0 ? " in a user namespace" : "") +
                      (iso.private_tmp ? " with a private /tmp"
                                       : ", sharing the host's /tmp (a private one could not be mounted)");
    return iso;
  }();
  return isolation;
}

RunOptions DefaultOptions() {
  RunOptions o;
  if (const char* t = std::getenv("CONVEYOR_DOCS_TEST_TIMEOUT"); t && std::atol(t) > 0) {
    o.timeout = milliseconds(1000 * std::atol(t));
  }
  return o;
}

RunResult RunBlock(const std::string& block, RunOptions options, const std::string& name) {
  return Runner(options).Run(block, name);
}

}  // namespace docs
