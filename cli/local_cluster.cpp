#include "cli/local_cluster.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/files.h"
#include "common/logging.h"
#include "common/net.h"

namespace conveyor::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string LastLines(const std::string& text, int n) {
  std::size_t pos = text.size();
  for (int i = 0; i <= n && pos != std::string::npos && pos > 0; ++i) pos = text.rfind('\n', pos - 1);
  return pos == std::string::npos ? text : text.substr(pos + 1);
}

// A file descriptor that becomes readable when `pid` exits; -1 if the kernel
// has no pidfd_open (callers then fall back to a bounded poll).
int PidFd(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// Waits until `path` holds an address (the child renames it into place once
// it serves), the child exits, or the deadline passes. Event-driven: inotify
// on the folder and a pidfd for the child.
StatusOr<std::string> WaitForPortFile(const std::string& path, pid_t pid, const std::string& name,
                                      const std::string& log, double timeout_s) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd < 0) return absl::InternalError("inotify_init1 failed");
  inotify_add_watch(fd, dir.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE);
  int child = PidFd(pid);
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  StatusOr<std::string> result = absl::DeadlineExceededError(name + " did not start within " +
                                                             std::to_string(static_cast<int>(timeout_s)) + " s; see " + log);
  for (;;) {
    std::string content = ReadFile(path);
    if (!content.empty() && content.back() == '\n') {
      content.pop_back();
      result = content;
      break;
    }
    int wstatus = 0;
    if (waitpid(pid, &wstatus, WNOHANG) == pid) {
      result = absl::UnavailableError(name + " exited before it served (" +
                                      (WIFEXITED(wstatus) ? "code " + std::to_string(WEXITSTATUS(wstatus))
                                                          : "signal " + std::to_string(WTERMSIG(wstatus))) +
                                      "):\n" + LastLines(ReadFile(log), 5));
      break;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p[2] = {{fd, POLLIN, 0}, {child, POLLIN, 0}};
    if (poll(p, child >= 0 ? 2 : 1, child >= 0 ? static_cast<int>(left) : 100) > 0) {
      char buf[4096];
      while (read(fd, buf, sizeof buf) > 0) {
      }
    }
  }
  close(fd);
  if (child >= 0) close(child);
  return result;
}

// The children's TLS flags; none without a certificate.
std::vector<std::string> TlsArgs(const TlsFiles& tls) {
  if (tls.cert.empty() && tls.key.empty() && tls.ca.empty()) return {};
  std::vector<std::string> args = {"--tls-cert", tls.cert, "--tls-key", tls.key, "--tls-ca", tls.ca};
  if (!tls.server_name.empty()) args.insert(args.end(), {"--tls-server-name", tls.server_name});
  return args;
}


}  // namespace

std::string ExecutableDir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : exe.parent_path().string();
}

int CountGpus(const std::string& bin_dir) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return 0;
  const std::string bin = bin_dir + "/stage_server";
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, STDERR_FILENO);
    execl(bin.c_str(), bin.c_str(), "--count-gpus", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[64];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  close(out[0]);
  int status = 0;
  if (pid > 0) waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? std::atoi(text.c_str()) : 0;
}

std::string LocalCluster::LogTails(int lines) const {
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Child& c : children_) names.push_back(c.name);
  }
  std::string tails;
  for (const std::string& name : names) {
    const std::string text = ReadFile(run_dir_ + "/" + name + ".log");
    std::string tail = LastLines(text, lines);
    const std::size_t report = text.find("==ERROR: ");
    if (report != std::string::npos) {
      const std::size_t from = text.rfind('\n', report);
      tail = text.substr(from == std::string::npos ? 0 : from + 1, 12000);
    }
    tails += "--- " + name + ".log ---\n" + tail + "\n";
  }
  return tails;
}

StatusOr<std::string> LocalCluster::Spawn(Child* child, const std::vector<std::string>& env) {
  const std::string log = run_dir_ + "/" + child->name + ".log";
  const std::string port_file = run_dir_ + "/" + child->name + ".port";
  std::remove(port_file.c_str());
  std::vector<std::string> argv = child->args;
  argv.push_back("--port-file");
  argv.push_back(port_file);
  pid_t pid = fork();
  if (pid < 0) return absl::ResourceExhaustedError("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    setpgid(0, 0);  // Ctrl-C at the terminal reaches the CLI alone, which stops us in order
    int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out >= 0) {
      dup2(out, STDOUT_FILENO);
      dup2(out, STDERR_FILENO);
    }
    for (const auto& e : child->env) putenv(const_cast<char*>(e.c_str()));
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execvp(cargv[0], cargv.data());
    std::perror(("cannot run " + argv[0]).c_str());
    _exit(127);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    child->pid = pid;
  }
  return WaitForPortFile(port_file, pid, child->name, log, start_timeout_s_);
}

StatusOr<std::string> LocalCluster::SpawnServer(Child* child, const std::vector<std::string>& env, bool metrics,
                                                const std::string& host) {
  if (!metrics) return Spawn(child, env);
  // Written before the server's port file: it serves metrics first.
  const std::string metrics_file = run_dir_ + "/" + child->name + ".metrics-port";
  child->args.insert(child->args.end(), {"--metrics-listen", host + ":0", "--metrics-port-file", metrics_file});
  CONVEYOR_ASSIGN_OR_RETURN(std::string address, Spawn(child, env));
  std::string bound = ReadFile(metrics_file);
  if (bound.empty() || bound.back() != '\n')
    return absl::InternalError(child->name + " serves but wrote no metrics address to " + metrics_file);
  bound.pop_back();
  metrics_addresses_.push_back(bound);
  return address;
}

StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const LocalClusterOptions& options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->start_timeout_s_ = options.start_timeout_s;
  c->remove_run_dir_ = options.remove_run_dir;
  const std::string stage_bin = std::filesystem::absolute(options.bin_dir + "/stage_server").string();
  const std::string coord_bin = options.bin_dir + "/coordinator";
  for (const auto& bin : {stage_bin, coord_bin}) {
    if (access(bin.c_str(), X_OK) != 0) return absl::NotFoundError("cannot find " + bin);
  }
  std::string tmpl = (std::filesystem::temp_directory_path() / "conveyor-local-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) return absl::InternalError("cannot create a temporary folder");
  c->run_dir_ = tmpl;
  auto st = c->StartChildren(options, stage_bin, coord_bin);
  if (st.ok()) return c;
  // The logs say why a server did not start: kept, and said where.
  if (!c->remove_run_dir_) st = Status(st.code(), std::string(st.message()) + "\n(its logs are kept in " + c->run_dir_ + ")");
  return st;
}

Status LocalCluster::StartChildren(const LocalClusterOptions& options, const std::string& stage_bin,
                                   const std::string& coord_bin) {
  LocalCluster* c = this;
  c->children_.resize(options.stages + 1);  // no reallocation: Spawn holds pointers
  const std::vector<std::string> tls = TlsArgs(options.tls);
  for (int i = 0; i < options.stages; ++i) {
    Child& child = c->children_[i];
    child.name = "stage-" + std::to_string(i);
    std::string device = i < static_cast<int>(options.devices.size()) ? options.devices[i] : "cpu";
    if (i < static_cast<int>(options.stage_prefixes.size())) child.args = options.stage_prefixes[i];
    const std::string host = i < static_cast<int>(options.stage_hosts.size()) ? options.stage_hosts[i] : "127.0.0.1";
    child.listen_arg = child.args.size() + 2;
    for (const std::string& a : {stage_bin, std::string("--listen"), host + ":0", std::string("--device"), device,
                                 std::string("--threads"), std::to_string(options.threads_per_stage),
                                 std::string("--checkpoint-dir"), c->run_dir_ + "/" + child.name + "/checkpoints",
                                 std::string("--log-level"), options.log_level})
      child.args.push_back(a);
    if (!options.profile_dir.empty()) {
      child.args.push_back("--profile-dir");
      child.args.push_back(options.profile_dir);
    }
    for (const auto& root : options.data_roots) {
      child.args.push_back("--data-root");
      child.args.push_back(root);
    }
    child.args.insert(child.args.end(), tls.begin(), tls.end());
    child.env = options.stage_env;
    std::vector<std::string> env;
    for (const auto& [stage, e] : options.first_start_env)
      if (stage == i) env.push_back(e);
    auto address = c->SpawnServer(&child, env, options.metrics, host);
    if (!address.ok()) return address.status();
    child.args[child.listen_arg] = *address;  // a restart comes back at the same address
    c->stage_addresses_.push_back(*address);
  }
  std::string stages;
  for (const auto& a : c->stage_addresses_) stages += (stages.empty() ? "" : ",") + a;
  Child& coordinator = c->children_.back();
  coordinator.name = "coordinator";
  coordinator.args = {coord_bin, "--listen", "127.0.0.1:0", "--stages", stages, "--state-dir",
                      c->run_dir_ + "/state", "--log-level", options.log_level};
  coordinator.listen_arg = 2;
  for (const auto& root : options.data_roots) {
    coordinator.args.push_back("--data-root");
    coordinator.args.push_back(root);
  }
  if (!options.auth_token.empty()) {
    const std::string token_file = c->run_dir_ + "/token";  // run_dir_ is the caller's alone (mkdtemp: 0700)
    CONVEYOR_RETURN_IF_ERROR(WriteFileAtomically(token_file, options.auth_token + "\n"));
    coordinator.args.insert(coordinator.args.end(), {"--auth-token-file", token_file});
  }
  coordinator.args.insert(coordinator.args.end(), tls.begin(), tls.end());
  auto address = c->SpawnServer(&coordinator, {}, options.metrics, "127.0.0.1");
  if (!address.ok()) return address.status();
  coordinator.args[coordinator.listen_arg] = *address;
  c->coordinator_address_ = *address;
  if (options.restart_stages) {
    c->wake_fd_ = eventfd(0, EFD_CLOEXEC);
    if (c->wake_fd_ < 0) return absl::InternalError("eventfd failed");
    c->supervisor_ = std::thread([p = c] { p->Supervise(); });
  }
  return absl::OkStatus();
}

void LocalCluster::Supervise() {
  const std::size_t stages = children_.size() - 1;
  for (;;) {
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
    std::vector<std::size_t> which;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      for (std::size_t i = 0; i < stages; ++i) {
        int fd = PidFd(children_[i].pid);
        if (fd < 0) continue;
        fds.push_back({fd, POLLIN, 0});
        which.push_back(i);
      }
    }
    poll(fds.data(), fds.size(), -1);
    for (std::size_t k = 1; k < fds.size(); ++k) {
      const bool exited = fds[k].revents & POLLIN;
      close(fds[k].fd);
      if (!exited) continue;
      Child& child = children_[which[k - 1]];
      int wstatus = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
        waitpid(child.pid, &wstatus, 0);
        ++restarts_;
      }
      LOG_WARN(child.name, " exited (", WIFSIGNALED(wstatus) ? "signal " + std::to_string(WTERMSIG(wstatus))
                                                              : "code " + std::to_string(WEXITSTATUS(wstatus)),
               "): starting it again at ", child.args[child.listen_arg]);
      auto address = Spawn(&child, {});
      if (!address.ok()) LOG_ERROR("cannot restart ", child.name, ": ", address.status().message());
    }
  }
}

void LocalCluster::Signal(int index, int signal) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::size_t i = index < 0 ? children_.size() - 1 : static_cast<std::size_t>(index);
  if (i < children_.size() && children_[i].pid > 0) kill(children_[i].pid, signal);
}

int LocalCluster::stage_restarts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return restarts_;
}

Status LocalCluster::RestartCoordinator() { return Restart(&children_.back()); }

Status LocalCluster::RestartStage(int index) {
  if (index < 0 || static_cast<std::size_t>(index) + 1 >= children_.size())
    return absl::InvalidArgumentError("no stage " + std::to_string(index) + " in this cluster");
  return Restart(&children_[static_cast<std::size_t>(index)]);
}

Status LocalCluster::Restart(Child* child) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    int wstatus = 0;
    if (child->pid > 0) waitpid(child->pid, &wstatus, 0);
    child->pid = -1;
  }
  return Spawn(child, {}).status();
}

LocalCluster::~LocalCluster() { Stop(); }

void LocalCluster::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (supervisor_.joinable()) {
    uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof one) < 0) LOG_WARN("cannot wake the stage supervisor");
    supervisor_.join();
    close(wake_fd_);
  }
  // The coordinator first, so it does not see its stages vanish mid-job.
  for (std::size_t i = children_.size(); i-- > 0;) {
    if (children_[i].pid > 0) kill(children_[i].pid, SIGTERM);
  }
  auto deadline = Clock::now() + std::chrono::seconds(10);
  for (std::size_t i = children_.size(); i-- > 0;) {
    const pid_t pid = children_[i].pid;
    if (pid <= 0) continue;
    int child = PidFd(pid);
    for (;;) {
      int wstatus = 0;
      pid_t r = waitpid(pid, &wstatus, WNOHANG);
      if (r == pid || r < 0) break;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        LOG_WARN(children_[i].name, " did not stop within 10 s: killing it");
        kill(pid, SIGKILL);
        waitpid(pid, &wstatus, 0);
        break;
      }
      pollfd p{child, POLLIN, 0};
      poll(&p, child >= 0 ? 1 : 0, child >= 0 ? static_cast<int>(left) : 20);
    }
    if (child >= 0) close(child);
    children_[i].pid = -1;
  }
  if (remove_run_dir_) {
    RemoveTree(run_dir_);
  }
}

}  // namespace conveyor::cli
