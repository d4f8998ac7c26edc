// A cluster on this machine for `conveyor local`: stage servers and a
// coordinator as child processes on loopback, each on a free port read back
// from its port file. The machine's cores are divided among the stages.
//
// Children get SIGTERM when the cluster is stopped or destroyed, and when this
// process dies (PR_SET_PDEATHSIG). Each stage keeps its checkpoints in its own
// folder under run_dir(). With `restart_stages` a supervisor thread starts a
// stage that died again at the same address, as Docker's restart policy would.
// With TLS files, every child serves and calls over mutual TLS; the caller
// configures its own channels (SetProcessTls).
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <string>
#include <vector>

#include "common/security.h"
#include "common/status.h"

namespace conveyor::cli {

struct LocalClusterOptions {
  int stages = 1;
  std::string bin_dir;               // holds stage_server and coordinator
  std::vector<std::string> devices;  // one per stage
  int threads_per_stage = 1;
  std::string log_level = "info";
  double start_timeout_s = 60;
  bool restart_stages = false;
  // Delete run_dir() (logs, state, checkpoints) once stopped; `conveyor local`
  // keeps it, tests do not.
  bool remove_run_dir = false;
  // Per stage, optional: the host to listen on (default 127.0.0.1), and words
  // to run it under, e.g. {"ip", "netns", "exec", "host-1"} (tests run stages
  // as separate hosts this way).
  std::vector<std::string> stage_hosts;
  std::vector<std::vector<std::string>> stage_prefixes;
  // Every stage server's environment ("NAME=value") beside the caller's,
  // restarts included.
  std::vector<std::string> stage_env;
  // Extra environment ("NAME=value") for the first start of one stage, e.g. a
  // chaos hook; a restarted stage runs without it.
  std::vector<std::pair<int, std::string>> first_start_env;
  TlsFiles tls;            // given to every child; none: no TLS
  std::string auth_token;  // the coordinator requires it for SubmitJob and CancelJob; empty: none
  std::string profile_dir;  // the stages' --profile-dir (absolute); empty: their checkpoint folders
  std::vector<std::string> data_roots;  // every server's --data-root; empty: the servers' default
  // Every server serves Prometheus metrics on a free port of its host
  // (--metrics-listen; metrics_addresses() has them).
  bool metrics = false;
};

class LocalCluster {
 public:
  static StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  const std::string& coordinator_address() const { return coordinator_address_; }
  const std::vector<std::string>& stage_addresses() const { return stage_addresses_; }
  // With options.metrics: each server's metrics HOST:PORT, the stages in
  // order, then the coordinator's (as first started).
  const std::vector<std::string>& metrics_addresses() const { return metrics_addresses_; }
  // Folder with the children's logs and the coordinator's state.
  const std::string& run_dir() const { return run_dir_; }

  // Idempotent: SIGTERM to every child, then waits for them (SIGKILL after a
  // grace period).
  void Stop();

  // Sends `signal` to stage `index` (-1: the coordinator). Thread-safe.
  void Signal(int index, int signal);
  // Starts the coordinator again at its address with its state (after it was
  // killed); waits until it serves.
  Status RestartCoordinator();
  // Starts stage `index` again at its address and with its folders (after it
  // was killed, in a cluster without restart_stages); waits until it serves.
  Status RestartStage(int index);
  // Times the supervisor started a stage again.
  int stage_restarts() const;
  // Each child's log, its last `lines` lines, or from a sanitizer's report
  // where one is there: what a failed job's "Socket closed" does not say.
  std::string LogTails(int lines) const;

 private:
  struct Child {
    std::string name;
    std::vector<std::string> args;  // without --port-file
    std::size_t listen_arg = 0;     // args[listen_arg] is the HOST:PORT to listen on
    std::vector<std::string> env;   // "NAME=value" it always runs with, restarts included
    pid_t pid = -1;
  };
  LocalCluster() = default;
  // Starts `child` (appending --port-file) and waits until it serves.
  StatusOr<std::string> Spawn(Child* child, const std::vector<std::string>& env);
  // Starts `child` as Spawn does; with `metrics` on `host`'s free port, whose
  // address it adds to metrics_addresses_.
  StatusOr<std::string> SpawnServer(Child* child, const std::vector<std::string>& env, bool metrics,
                                    const std::string& host);
  void Supervise();
  // Reaps `child` (killed) and starts it again where it was.
  Status Restart(Child* child);
  // Start's children, in run_dir_: the stages, then the coordinator.
  Status StartChildren(const LocalClusterOptions& options, const std::string& stage_bin, const std::string& coord_bin);

  double start_timeout_s_ = 60;
  bool remove_run_dir_ = false;
  std::string run_dir_;
  mutable std::mutex mu_;  // guards children_ pids, restarts_, stopping_
  std::vector<Child> children_;  // stages in order, then the coordinator
  std::vector<std::string> stage_addresses_;
  std::string coordinator_address_;
  std::vector<std::string> metrics_addresses_;
  int restarts_ = 0;
  bool stopping_ = false;
  int wake_fd_ = -1;  // eventfd: wakes the supervisor to stop
  std::thread supervisor_;
};

// The folder of the running executable (to find stage_server and coordinator).
std::string ExecutableDir();

// CUDA devices a stage server would see, asked of `bin_dir`/stage_server in a
// child process: the CLI itself never initialises CUDA (a CUDA context in a
// process that forks and runs gRPC is trouble). 0 when it cannot tell.
int CountGpus(const std::string& bin_dir);

}  // namespace conveyor::cli
