// Helpers shared by the suites: tolerance checks against the reference, job
// files, and running the project's binaries.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cli/local_cluster.h"
#include "cli/reference.h"
#include "common/security.h"
#include "conveyor.pb.h"

namespace conveyor::testing {

// The equality bar of the project: fp32, CPU.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

// Trains the reference for `yaml` (which must parse) on `device`.
cli::ReferenceResult Reference(const std::string& yaml, const std::string& device = "cpu");

// EXPECTs per-step losses and every parameter of a pipelined run to equal the
// reference's within kRtol/kAtol.
void ExpectMatchesReference(const v1::JobStatus& run, const std::vector<std::pair<std::string, at::Tensor>>& params,
                            const cli::ReferenceResult& ref);

// Path of one of the project's executables.
std::string Binary(const std::string& name);

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs argv (no shell; argv[0] is looked up in PATH) and collects its output.
CommandResult RunCommand(const std::vector<std::string>& argv);

bool HaveFashionMnist();

// The final parameters of `job_id`, in model order, read over gRPC from the
// stage servers at `stages`.
std::vector<std::pair<std::string, at::Tensor>> ServerParameters(const std::vector<std::string>& stages,
                                                                 const std::string& job_id);

// Submits `yaml` to the coordinator at `coordinator` over gRPC (EXPECTs it is
// accepted) and returns the job id.
std::string Submit(const std::string& coordinator, const std::string& yaml);
// Follows the job to its end, through coordinator restarts (the watch opens
// again and waits for the coordinator to serve), calling `on_status` with
// every status seen; returns the final status, losses included.
v1::JobStatus Follow(const std::string& coordinator, const std::string& job_id,
                     const std::function<void(const v1::JobStatus&)>& on_status = nullptr);
inline v1::JobStatus SubmitAndWait(const std::string& coordinator, const std::string& yaml,
                                   const std::function<void(const v1::JobStatus&)>& on_status = nullptr) {
  return Follow(coordinator, Submit(coordinator, yaml), on_status);
}

// A local cluster of `stages` stage server processes and a coordinator on
// loopback, its folder removed when it stops; EXPECTs it to start (null if not).
std::unique_ptr<cli::LocalCluster> StartCluster(int stages);

// A fresh, empty folder under the test's temporary folder.
std::string MakeTempDir(const std::string& prefix);

// MakeTempDir's folder, removed with all in it when this goes out of scope:
// a test run outside ctest (whose TMPDIR goes when the run ends) leaves
// nothing in /tmp. Declare it before what writes there (a coordinator with
// its database open), so that it goes last.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix) : path_(MakeTempDir(prefix)) {}
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// scripts/make-certs.sh DIR NAME HOST...: DIR/NAME.crt and .key, signed by
// DIR's CA (made on first use), naming `hosts`; EXPECTs it to work. Returns
// the three files as a process would be given them.
TlsFiles MakeCertificate(const std::string& dir, const std::string& name, const std::vector<std::string>& hosts = {});

}  // namespace conveyor::testing
