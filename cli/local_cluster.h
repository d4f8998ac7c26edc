// A cluster on this machine for `conveyor local`: stage servers and a
// coordinator as child processes on loopback, each on a free port read back
// from its port file. The machine's cores are divided among the stages.
//
// Children get SIGTERM when the cluster is stopped or destroyed, and when this
// process dies (PR_SET_PDEATHSIG). With TLS files, every child serves and calls
// over mutual TLS; the caller configures its own channels (SetProcessTls).
#pragma once

#include <sys/types.h>

#include <memory>
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
  TlsFiles tls;            // given to every child; none: no TLS
  std::string auth_token;  // the coordinator requires it for SubmitJob and CancelJob; empty: none
};

class LocalCluster {
 public:
  static StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  const std::string& coordinator_address() const { return coordinator_address_; }
  const std::vector<std::string>& stage_addresses() const { return stage_addresses_; }
  // Folder with the children's logs and the coordinator's state.
  const std::string& run_dir() const { return run_dir_; }

  // Idempotent: SIGTERM to every child, then waits for them (SIGKILL after a
  // grace period).
  void Stop();

 private:
  LocalCluster() = default;
  StatusOr<std::string> Spawn(const std::string& name, const std::vector<std::string>& args);

  double start_timeout_s_ = 60;
  std::string run_dir_;
  std::vector<pid_t> pids_;
  std::vector<std::string> names_;
  std::vector<std::string> stage_addresses_;
  std::string coordinator_address_;
};

// The folder of the running executable (to find stage_server and coordinator).
std::string ExecutableDir();

// CUDA devices a stage server would see, asked of `bin_dir`/stage_server in a
// child process: the CLI itself never initialises CUDA (a CUDA context in a
// process that forks and runs gRPC is trouble). 0 when it cannot tell.
int CountGpus(const std::string& bin_dir);

}  // namespace conveyor::cli
