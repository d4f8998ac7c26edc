// The docs are tested (issue 15). Every fenced shell block (sh, bash, shell,
// console) of README.md, docs/*.md and deploy/README.md is one test case: it
// runs on loopback, or is skipped because a marker right above it says why:
//
//   <!-- docs-test: skip: needs GPUs -->
//
// (only blank lines between the marker and the block's fence). A marker with
// no reason, or one that precedes no shell block, fails DocsFiles.MarkersAndFences.
//
// How a block runs (RunBlock): bash with `set -euo pipefail`, stdin from
// /dev/null, in a fresh folder whose entries are symbolic links to every
// top-level entry of the source tree plus `build` -> the build folder, so that
// `B=build/bin; $B/stage_server ...` and `examples/toy.yaml` work whatever the
// build folder is called; HOME is that folder, build/bin comes first on PATH
// and no CONVEYOR_* variable is passed on. Where it may (root, or an
// unprivileged user namespace), it runs in a private network namespace with
// loopback up and a private /tmp, so the fixed ports the docs use
// (127.0.0.1:50050) and paths like /tmp/conveyor collide with nothing and start
// empty; where it may not, it runs without and says so. Each block is its own
// session and process group; when it ends (or after its timeout, 300 s,
// CONVEYOR_DOCS_TEST_TIMEOUT), whatever it left running is stopped: SIGTERM to
// the group and to every orphan (this process is a child subreaper, so they
// come back to it), SIGKILL after a grace period, and all of them reaped. Waits
// are on events (poll on the output pipe and a signalfd), never sleeps.
//
// Overrides, for the self-tests and for trying a document out:
//   CONVEYOR_DOCS_TEST_FILES=a.md:b.md  the documents to test (default: above)
//   CONVEYOR_DOCS_TEST_TIMEOUT=SECONDS   per block (default 300)
//   CONVEYOR_DOCS_TEST_ISOLATION=none    run without namespaces
//
// DocsTree.NoWorkPeriodNumbers also reads every file git tracks (tests/fixtures
// apart) and fails, naming file and line, where a work period is counted as a
// unit of the project's history: the word "session" and a number.
//
// Torch-free and linked against GoogleTest only.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#ifndef CONVEYOR_SOURCE_DIR
#error "CONVEYOR_SOURCE_DIR must name the source tree"
#endif
#ifndef CONVEYOR_BUILD_DIR
#error "CONVEYOR_BUILD_DIR must name the build folder"
#endif

extern char** environ;

namespace docs {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---------------------------------------------------------------------------
// Markdown: fenced blocks and markers.

struct Block {
  std::string file;       // as shown: relative to the source tree where it lies there
  int line = 0;           // the opening fence's line, 1-based
  std::string info;       // the info string's first word, lower case
  std::vector<std::string> lines;  // the block's lines, fence indentation removed
  std::string script;     // what runs: the lines (for console, the commands only)
  bool marked = false;    // a docs-test marker precedes it
  int marker_line = 0;
  std::string reason;     // the marker's reason (empty: a failure)
};

// gtest prints parameters in --gtest_list_tests; keep it one short line.
void PrintTo(const Block& b, std::ostream* os) { *os << b.file << ":" << b.line << " (" << b.info << ")"; }

struct Problem {
  std::string file;
  int line = 0;
  std::string message;
};

struct Parsed {
  std::vector<Block> blocks;  // shell blocks only
  std::vector<Problem> problems;
};

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

bool IsShellInfo(const std::string& info) {
  return info == "sh" || info == "bash" || info == "shell" || info == "console";
}

// A console block shows commands after a "$ " prompt and their output; only the
// commands run (with their continuation lines after a trailing backslash).
std::string ConsoleCommands(const std::vector<std::string>& lines) {
  std::string out;
  bool continued = false;
  for (const std::string& l : lines) {
    std::string cmd;
    if (continued) {
      cmd = l;
    } else {
      const std::string t = l.substr(std::min(l.find_first_not_of(' '), l.size()));
      if (t.rfind("$ ", 0) == 0) {
        cmd = t.substr(2);
      } else if (t == "$") {
        cmd = "";
      } else {
        out += "\n";  // output: keeps line numbers
        continue;
      }
    }
    continued = !cmd.empty() && cmd.back() == '\\';
    out += cmd + "\n";
  }
  return out;
}

Parsed ParseMarkdown(const std::string& file, const std::string& text) {
  static const std::regex kFence(R"(^( {0,3})(`{3,}|~{3,})(.*)$)");
  static const std::regex kMarker(R"(^\s*<!--\s*docs-test\s*:(.*?)-->\s*$)");
  static const std::regex kSkip(R"(^\s*skip\s*:(.*)$)");

  Parsed parsed;
  std::vector<std::string> lines;
  {
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) {
      if (!l.empty() && l.back() == '\r') l.pop_back();
      lines.push_back(l);
    }
  }
  auto problem = [&](int line, std::string message) { parsed.problems.push_back({file, line, std::move(message)}); };

  struct Marker {
    int line = 0;
    std::string reason;
  };
  bool have_marker = false;
  Marker marker;
  auto orphan = [&](const std::string& why) {
    problem(marker.line, "the docs-test marker precedes no shell block (" + why + "); put it right above the " +
                             "```sh block it is for, with only blank lines between");
    have_marker = false;
  };

  bool in_fence = false;
  char fence_char = 0;
  size_t fence_len = 0, fence_indent = 0;
  Block current;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    const int n = static_cast<int>(i) + 1;
    std::smatch m;
    if (in_fence) {
      const std::string t = Trim(l);
      const size_t lead = l.find_first_not_of(' ');
      if (lead != std::string::npos && lead <= 3 && t.size() >= fence_len &&
          t.find_first_not_of(fence_char) == std::string::npos) {
        in_fence = false;
        if (IsShellInfo(current.info)) {
          std::string script;
          if (current.info == "console") {
            script = ConsoleCommands(current.lines);
          } else {
            for (const auto& bl : current.lines) script += bl + "\n";
          }
          current.script = script;
          parsed.blocks.push_back(current);
        }
        continue;
      }
      size_t strip = 0;
      while (strip < fence_indent && strip < l.size() && l[strip] == ' ') ++strip;
      current.lines.push_back(l.substr(strip));
      continue;
    }
    if (std::regex_match(l, m, kFence) && !(m[2].str()[0] == '`' && m[3].str().find('`') != std::string::npos)) {
      in_fence = true;
      fence_indent = m[1].length();
      fence_char = m[2].str()[0];
      fence_len = m[2].length();
      current = Block{};
      current.file = file;
      current.line = n;
      std::istringstream info(m[3].str());
      info >> current.info;
      current.info = Lower(current.info);
      if (have_marker) {
        if (IsShellInfo(current.info)) {
          current.marked = true;
          current.marker_line = marker.line;
          current.reason = marker.reason;
          have_marker = false;
        } else {
          orphan("the block at line " + std::to_string(n) + " is " +
                 (current.info.empty() ? std::string("untagged") : "`" + current.info + "`") +
                 ", which is not run anyway");
        }
      }
      continue;
    }
    if (std::regex_match(l, m, kMarker)) {
      if (have_marker) orphan("another marker follows at line " + std::to_string(n));
      std::smatch s;
      const std::string directive = m[1].str();
      if (!std::regex_match(directive, s, kSkip)) {
        problem(n, "unknown docs-test directive '" + Trim(directive) +
                       "': the only one is <!-- docs-test: skip: REASON -->");
        continue;
      }
      have_marker = true;
      marker = {n, Trim(s[1].str())};
      if (marker.reason.empty()) problem(n, "the docs-test skip marker gives no reason: say why the block cannot run");
      continue;
    }
    const std::string t = Trim(l);
    if (t.rfind("<!--", 0) == 0 && t.find("docs-test") != std::string::npos) {
      problem(n, "a malformed docs-test marker: write <!-- docs-test: skip: REASON --> on a line of its own");
      continue;
    }
    if (t.empty()) continue;
    if (have_marker) orphan("text follows at line " + std::to_string(n));
  }
  if (in_fence) problem(current.line, "this fence is never closed");
  if (have_marker) orphan("the file ends");
  return parsed;
}

// ---------------------------------------------------------------------------
// The documents.

struct Document {
  std::string name;  // shown in test names and messages
  std::string path;  // to read
};

std::vector<Document> Documents() {
  std::vector<Document> docs;
  const fs::path src = CONVEYOR_SOURCE_DIR;
  if (const char* files = std::getenv("CONVEYOR_DOCS_TEST_FILES"); files && *files) {
    std::istringstream in(files);
    for (std::string f; std::getline(in, f, ':');) {
      if (f.empty()) continue;
      const fs::path p = fs::path(f).is_absolute() ? fs::path(f) : src / f;
      docs.push_back({f, p.string()});
    }
    return docs;
  }
  docs.push_back({"README.md", (src / "README.md").string()});
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(src / "docs", ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ".md") {
      found.push_back(it->path().lexically_relative(src).string());
    }
  }
  std::sort(found.begin(), found.end());
  for (const auto& f : found) docs.push_back({f, (src / f).string()});
  docs.push_back({"deploy/README.md", (src / "deploy/README.md").string()});
  return docs;
}

struct AllDocs {
  std::vector<Block> blocks;
  std::vector<Problem> problems;
  std::vector<std::string> names;
};

const AllDocs& Docs() {
  static const AllDocs all = [] {
    AllDocs a;
    for (const Document& d : Documents()) {
      a.names.push_back(d.name);
      std::ifstream in(d.path, std::ios::binary);
      if (!in) {
        a.problems.push_back({d.name, 0, "cannot read " + d.path});
        continue;
      }
      std::ostringstream text;
      text << in.rdbuf();
      Parsed p = ParseMarkdown(d.name, text.str());
      a.blocks.insert(a.blocks.end(), p.blocks.begin(), p.blocks.end());
      a.problems.insert(a.problems.end(), p.problems.begin(), p.problems.end());
    }
    return a;
  }();
  return all;
}

std::vector<Block> AllBlocks() { return Docs().blocks; }

std::string TestName(const ::testing::TestParamInfo<Block>& info) {
  std::string name = info.param.file + "_" + std::to_string(info.param.line);
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  // Two documents whose names sanitise alike would give one name twice.
  static std::set<std::string> seen;
  std::string unique = name;
  for (int k = 2; !seen.insert(unique).second; ++k) unique = name + "_" + std::to_string(k);
  return unique;
}

// ---------------------------------------------------------------------------
// Running a block.

struct Isolation {
  std::vector<std::string> prefix;  // unshare ... --, or nothing
  bool private_tmp = false;
  std::string description;          // for the log
};

// Runs argv with output captured; for short set-up commands only.
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

bool UnderTmp(const std::string& path) {
  std::error_code ec;
  const std::string real = fs::weakly_canonical(path, ec).string();
  return real == "/tmp" || real.rfind("/tmp/", 0) == 0;
}

// The folder directly in /tmp that holds the clone, where it lies under /tmp
// (the private /tmp shows it, bound back in); "docs-block" otherwise.
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

struct RunOptions {
  milliseconds timeout{300000};
  milliseconds grace{10000};  // between SIGTERM and SIGKILL for what the block leaves running
};

RunOptions DefaultOptions() {
  RunOptions o;
  if (const char* t = std::getenv("CONVEYOR_DOCS_TEST_TIMEOUT"); t && std::atol(t) > 0) {
    o.timeout = milliseconds(1000 * std::atol(t));
  }
  return o;
}

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

    const pid_t pid = fork();
    if (pid < 0) {
      result.output = std::string("fork: ") + std::strerror(errno);
      close(fds[1]);
    } else if (pid == 0) {
      setsid();  // its own session and process group: pgid == pid
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      const int null = open("/dev/null", O_RDONLY);
      if (null >= 0) dup2(null, 0);
      sigprocmask(SIG_SETMASK, &old, nullptr);
      execvpe(args[0], args.data(), env.data());
      const char msg[] = "docs_test: cannot exec the runner\n";
      (void)!write(2, msg, sizeof msg - 1);
      _exit(127);
    }
    if (pid > 0) close(fds[1]);
    output_ = &result.output;

    // Wait for the block (the group leader) to end, or for the timeout.
    const auto deadline = start + options_.timeout;
    int status = 0;
    bool done = pid < 0;
    while (!done) {
      if (Clock::now() >= deadline) {
        result.timed_out = true;
        break;
      }
      Wait(deadline);
      done = Reap(pid, &status);
    }

    // Stop what is still running: the block's group, and orphans that left it.
    std::set<pid_t> signalled;
    auto signal_all = [&](int sig, bool again) {
      if (pid > 0) kill(-pid, sig);
      for (pid_t c : Children()) {
        if (again || signalled.insert(c).second) kill(c, sig);
      }
    };
    if (pid > 0) {
      result.left_running = static_cast<int>(Children(true).size()) - (done ? 0 : 1);
      signal_all(SIGTERM, false);
      const auto kill_at = Clock::now() + options_.grace;
      const auto give_up = kill_at + milliseconds(10000);
      bool killed = false;
      for (;;) {
        if (!done) done = Reap(pid, &status);
        else Reap(-1, nullptr);
        siginfo_t info{};
        if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) < 0 && errno == ECHILD) break;  // all reaped
        const auto now = Clock::now();
        if (!killed && now >= kill_at) {
          killed = true;
          result.needed_kill = true;
          signal_all(SIGKILL, true);
        } else if (killed && now >= give_up) {
          result.survivors = Children();
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

// `name` is bash's $0: its messages then read "README.md:75: line 3: ...".
RunResult RunBlock(const std::string& block, RunOptions options = DefaultOptions(),
                   const std::string& name = "docs-block") {
  return Runner(options).Run(block, name);
}

// The block with bash's line numbers (line 1 is the line after the fence).
std::string Numbered(const Block& b) {
  std::ostringstream s;
  for (size_t i = 0; i < b.lines.size(); ++i) s << std::setw(4) << i + 1 << " | " << b.lines[i] << "\n";
  return s.str();
}

std::string Describe(const RunResult& r) {
  std::ostringstream s;
  if (r.timed_out) {
    s << "did not finish within its timeout (" << std::fixed << std::setprecision(0) << r.seconds
      << " s; CONVEYOR_DOCS_TEST_TIMEOUT sets it) and was stopped";
  } else {
    s << "exited with " << r.exit_code << " after " << std::fixed << std::setprecision(1) << r.seconds << " s";
  }
  s << "; ran in " << r.isolation;
  if (r.left_running > 0) s << "; stopped " << r.left_running << " process(es) it left running";
  if (r.needed_kill) s << " (SIGKILL: SIGTERM did not end them)";
  if (!r.survivors.empty()) s << "; " << r.survivors.size() << " process(es) survived SIGKILL";
  return s.str();
}

// ---------------------------------------------------------------------------
// The documents' blocks.

class DocsBlock : public ::testing::TestWithParam<Block> {};

TEST_P(DocsBlock, Runs) {
  const Block& b = GetParam();
  const std::string where = b.file + ":" + std::to_string(b.line);
  if (b.marked) {
    if (b.reason.empty()) {
      FAIL() << where << ": the docs-test skip marker at line " << b.marker_line
             << " gives no reason; write <!-- docs-test: skip: WHY -->, or remove it and let the block run";
    }
    GTEST_SKIP() << where << ": " << b.reason;
  }
  const RunResult r = RunBlock(b.script, DefaultOptions(), where);
  std::cout << where << ": " << Describe(r) << "\n";
  EXPECT_TRUE(r.exit_code == 0 && !r.timed_out && r.survivors.empty())
      << where << ": the block " << Describe(r) << "\n--- the block (line 1 is " << b.file << ":" << b.line + 1
      << "; mark it <!-- docs-test: skip: REASON --> only if it cannot run here) ---\n"
      << Numbered(b) << "--- its output ---\n"
      << r.output << (r.output.empty() || r.output.back() == '\n' ? "" : "\n") << "--- end ---";
}

INSTANTIATE_TEST_SUITE_P(Docs, DocsBlock, ::testing::ValuesIn(AllBlocks()), TestName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DocsBlock);

TEST(DocsFiles, MarkersAndFences) {
  for (const Problem& p : Docs().problems) ADD_FAILURE() << p.file << ":" << p.line << ": " << p.message;
}

TEST(DocsFiles, HaveShellBlocks) {
  // A parser that found nothing, or a wrong source folder, would pass every block test.
  if (std::getenv("CONVEYOR_DOCS_TEST_FILES")) GTEST_SKIP() << "CONVEYOR_DOCS_TEST_FILES names the documents";
  int readme = 0, docs = 0;
  for (const Block& b : Docs().blocks) (b.file == "README.md" ? readme : docs)++;
  EXPECT_GT(readme, 0) << "no shell block found in " << CONVEYOR_SOURCE_DIR << "/README.md";
  EXPECT_GT(docs, 0) << "no shell block found in docs/ or deploy/README.md";
}

// ---------------------------------------------------------------------------
// The tree speaks for itself: a figure names its date and its machine or cards,
// the story of a change lives in its commit message, and a comment says why the
// code is as it is. So no tracked file counts the project's history in work
// periods ("session" and a number), which tell a reader nothing. Only
// tests/fixtures is left out: files kept as the tools that wrote them left them.

struct Mention {
  int line = 0;
  std::string text;  // the line, trimmed and shortened
};

// Every "session" or "sessions", as a word in any case, followed by blanks and
// a digit.
std::vector<Mention> WorkPeriodMentions(const std::string& text) {
  static const std::string kWord = "session";
  const std::string lower = Lower(text);
  auto is = [&](size_t i, int (*pred)(int)) { return i < lower.size() && pred(static_cast<unsigned char>(lower[i])); };
  std::vector<Mention> found;
  for (size_t at = lower.find(kWord); at != std::string::npos; at = lower.find(kWord, at + 1)) {
    if (at > 0 && is(at - 1, std::isalnum)) continue;
    size_t i = at + kWord.size();
    if (i < lower.size() && lower[i] == 's') ++i;
    const size_t word_end = i;
    while (is(i, std::isspace)) ++i;
    if (i == word_end || !is(i, std::isdigit)) continue;
    const size_t begin = text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
    const size_t end = std::min(text.find('\n', at), text.size());
    std::string shown = Trim(text.substr(begin, end - begin));
    if (shown.size() > 160) shown = shown.substr(0, 157) + "...";
    found.push_back({1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n')), shown});
  }
  return found;
}

TEST(DocsTree, NoWorkPeriodNumbers) {
  std::string listing;
  const int rc = RunQuiet({"git", "-C", CONVEYOR_SOURCE_DIR, "ls-files", "-z"}, &listing);
  if (rc != 0) {
    GTEST_SKIP() << "cannot list the tracked files (`git -C " << CONVEYOR_SOURCE_DIR << " ls-files` exited with "
                 << rc << "; a tree outside git, or no git installed): " << listing;
  }
  int files = 0;
  std::string report;
  std::istringstream names(listing);
  for (std::string name; std::getline(names, name, '\0');) {
    if (name.empty() || name.rfind("tests/fixtures/", 0) == 0) continue;
    std::ifstream in(fs::path(CONVEYOR_SOURCE_DIR) / name, std::ios::binary);
    if (!in) continue;  // tracked but removed from the work tree
    std::ostringstream text;
    text << in.rdbuf();
    if (text.str().find('\0') != std::string::npos) continue;  // not text
    ++files;
    for (const Mention& m : WorkPeriodMentions(text.str())) {
      report += "  " + name + ":" + std::to_string(m.line) + ": " + m.text + "\n";
    }
  }
  EXPECT_GT(files, 0) << "git listed no text file in " << CONVEYOR_SOURCE_DIR;
  EXPECT_TRUE(report.empty())
      << "tracked files count the project's history in work periods (\"session\" and a number), which a reader "
         "cannot place:\n"
      << report
      << "Name the figure's date and its machine or cards instead (e.g. \"2x H100, 2026-11-27\", with the "
         "bench/RESULTS.md entry of that date), put the story of a change in its commit message, and let a "
         "comment say why the code is as it is now.";
}

TEST(DocsTree, FindsWorkPeriodsInAnyCaseAndNothingElse) {
  const std::string word = "sess" "ion";  // kept apart, so that this file passes the check above
  const std::string upper = "S" + word.substr(1);
  const auto found = WorkPeriodMentions("a\nfigures of " + word + " 27, " + upper + " 17's\n\n" + word +
                                        "s 12 and 13\n" + "SESSION\t3\n" + word + "\n4\n");
  ASSERT_EQ(found.size(), 5u);
  EXPECT_EQ(found[0].line, 2);
  EXPECT_EQ(found[0].text, "figures of " + word + " 27, " + upper + " 17's");
  EXPECT_EQ(found[1].line, 2);
  EXPECT_EQ(found[2].line, 4);
  EXPECT_EQ(found[3].line, 5);
  EXPECT_EQ(found[4].line, 6);  // the number on the next line
  for (const std::string& text : {"its own " + word + " and process group", "pos" + word + " 5",
                                  "bench/results/" + word + "22-2026-11-26/", word + "_id 4", "a " + word + ":"}) {
    EXPECT_TRUE(WorkPeriodMentions(text).empty()) << text;
  }
}

// ---------------------------------------------------------------------------
// The parser.

TEST(DocsParser, FindsShellBlocksOnly) {
  const Parsed p = ParseMarkdown("t.md",
                                 "# T\n"
                                 "```sh\necho one\n```\n"
                                 "```\nuntagged\n```\n"
                                 "```yaml\nk: v\n```\n"
                                 "```text\nt\n```\n"
                                 "```json\n{}\n```\n"
                                 "```bash\necho two\n```\n"
                                 "~~~shell\necho three\n~~~\n"
                                 "````Bash {.x}\n```\necho four\n````\n"
                                 "  ```sh\n  echo five\n   indented\n  ```\n");
  EXPECT_TRUE(p.problems.empty());
  ASSERT_EQ(p.blocks.size(), 5u);
  EXPECT_EQ(p.blocks[0].line, 2);
  EXPECT_EQ(p.blocks[0].script, "echo one\n");
  EXPECT_EQ(p.blocks[1].info, "bash");
  EXPECT_EQ(p.blocks[1].line, 17);
  EXPECT_EQ(p.blocks[2].script, "echo three\n");
  EXPECT_EQ(p.blocks[3].info, "bash");
  EXPECT_EQ(p.blocks[3].script, "```\necho four\n");
  EXPECT_EQ(p.blocks[4].script, "echo five\n indented\n");
  for (const Block& b : p.blocks) EXPECT_FALSE(b.marked);
}

TEST(DocsParser, ConsoleRunsTheCommandsOnly) {
  const Parsed p = ParseMarkdown("t.md", "```console\n$ echo a \\\n    b\na b\n$ true\n```\n");
  ASSERT_EQ(p.blocks.size(), 1u);
  EXPECT_EQ(p.blocks[0].script, "echo a \\\n    b\n\ntrue\n");
}

TEST(DocsParser, MarkerSkipsTheNextShellBlock) {
  const Parsed p = ParseMarkdown("t.md",
                                 "<!-- docs-test: skip: needs GPUs -->\n\n\n"
                                 "```sh\nnvidia-smi\n```\n"
                                 "```sh\ntrue\n```\n");
  EXPECT_TRUE(p.problems.empty());
  ASSERT_EQ(p.blocks.size(), 2u);
  EXPECT_TRUE(p.blocks[0].marked);
  EXPECT_EQ(p.blocks[0].reason, "needs GPUs");
  EXPECT_EQ(p.blocks[0].marker_line, 1);
  EXPECT_FALSE(p.blocks[1].marked);
}

TEST(DocsParser, MarkerWithoutReasonIsAProblem) {
  const Parsed p = ParseMarkdown("t.md", "<!-- docs-test: skip:   -->\n```sh\ntrue\n```\n");
  ASSERT_EQ(p.problems.size(), 1u);
  EXPECT_EQ(p.problems[0].line, 1);
  EXPECT_NE(p.problems[0].message.find("no reason"), std::string::npos);
  ASSERT_EQ(p.blocks.size(), 1u);
  EXPECT_TRUE(p.blocks[0].marked);
  EXPECT_EQ(p.blocks[0].reason, "");
}

TEST(DocsParser, MarkerBeforeNoShellBlockIsAProblem) {
  const std::vector<std::string> docs = {
      "<!-- docs-test: skip: x -->\nsome text\n```sh\ntrue\n```\n",
      "<!-- docs-test: skip: x -->\n```yaml\nk: v\n```\n",
      "<!-- docs-test: skip: x -->\n```\nuntagged\n```\n",
      "<!-- docs-test: skip: x -->\n<!-- docs-test: skip: y -->\n```sh\ntrue\n```\n",
      "text\n\n<!-- docs-test: skip: x -->\n",
  };
  for (const std::string& d : docs) {
    const Parsed p = ParseMarkdown("t.md", d);
    ASSERT_EQ(p.problems.size(), 1u) << d;
    EXPECT_EQ(p.problems[0].line, d.rfind("text", 0) == 0 ? 3 : 1) << d;
    EXPECT_NE(p.problems[0].message.find("precedes no shell block"), std::string::npos) << d;
  }
  // The shell block after the text is not skipped.
  const Parsed p = ParseMarkdown("t.md", docs[0]);
  ASSERT_EQ(p.blocks.size(), 1u);
  EXPECT_FALSE(p.blocks[0].marked);
}

TEST(DocsParser, OtherMistakesAreProblems) {
  EXPECT_EQ(ParseMarkdown("t.md", "<!-- docs-test: skipp: x -->\n```sh\ntrue\n```\n").problems.size(), 1u);
  EXPECT_EQ(ParseMarkdown("t.md", "<!-- docs-test skip x -->\n").problems.size(), 1u);
  EXPECT_EQ(ParseMarkdown("t.md", "```sh\ntrue\n").problems.size(), 1u);  // never closed
  // A marker inside a block, or quoted in prose, is no marker.
  EXPECT_TRUE(ParseMarkdown("t.md", "```markdown\n<!-- docs-test: skip: -->\n```\n").problems.empty());
  EXPECT_TRUE(ParseMarkdown("t.md", "Write `<!-- docs-test: skip: REASON -->` above it.\n").problems.empty());
}

// ---------------------------------------------------------------------------
// The runner.

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

// ---------------------------------------------------------------------------
// The whole test, run on documents of our own: a failing unmarked block, a
// marker without reason and a marker above no shell block each fail it.

struct SelfRun {
  int exit_code = -1;
  std::string output;
};

SelfRun RunSelf(const std::string& markdown) {
  std::string tmpl = (fs::temp_directory_path() / "conveyor-docs-self-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) return {};
  const std::string md = tmpl + "/doc.md";
  std::ofstream(md) << markdown;
  setenv("CONVEYOR_DOCS_TEST_FILES", md.c_str(), 1);
  SelfRun r;
  r.exit_code = RunQuiet({"/proc/self/exe", "--gtest_filter=Docs/DocsBlock.*:DocsFiles.*"}, &r.output);
  unsetenv("CONVEYOR_DOCS_TEST_FILES");
  std::error_code ec;
  fs::remove_all(tmpl, ec);
  return r;
}

TEST(DocsSelfTest, UnmarkedFailingBlockFails) {
  const SelfRun r = RunSelf("# Doc\n\n```sh\necho printed-before\necho \"$DOCS_UNSET\"\necho not-reached >&2\n```\n");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("exited with 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("   2 | echo \"$DOCS_UNSET\""), std::string::npos) << r.output;  // the block
  // bash's own message names the block and its line.
  EXPECT_NE(r.output.find("doc.md:3: line 2: DOCS_UNSET: unbound variable"), std::string::npos) << r.output;
  const auto out = r.output.find("--- its output ---");
  ASSERT_NE(out, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("printed-before", out), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("not-reached", out), std::string::npos) << r.output;
}

TEST(DocsSelfTest, MarkerWithoutReasonFails) {
  const SelfRun r = RunSelf("<!-- docs-test: skip: -->\n```sh\ntrue\n```\n");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("gives no reason"), std::string::npos) << r.output;
}

TEST(DocsSelfTest, MarkerAboveNoShellBlockFails) {
  const SelfRun r = RunSelf("<!-- docs-test: skip: not a shell block -->\n```yaml\nk: v\n```\n");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("precedes no shell block"), std::string::npos) << r.output;
}

TEST(DocsSelfTest, MarkedAndPassingBlocksPass) {
  const SelfRun r = RunSelf(
      "<!-- docs-test: skip: shows a failure -->\n\n```sh\nfalse\n```\n\n"
      "```bash\nB=build/bin\n[ -d examples ]\nsleep infinity &\n```\n");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("shows a failure"), std::string::npos) << r.output;
  // Run: the second block and MarkersAndFences; skipped: the first block and HaveShellBlocks.
  EXPECT_NE(r.output.find("[  PASSED  ] 2 tests"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[  SKIPPED ] 2 tests"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace docs
