#include "cli/torch_binary.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/local_cluster.h"

namespace conveyor::cli {
namespace {

constexpr char kTorchBinary[] = "conveyor-torch";

// Returns only if the exec failed.
Status ExecTorchBinary(char** argv) {
  const std::string path = ExecutableDir() + "/" + kTorchBinary;
  std::fflush(nullptr);
  execv(path.c_str(), argv);
  const int err = errno;
  return absl::FailedPreconditionError(
      "this command needs LibTorch, which runs in " + path + " (" + std::strerror(err) +
      "): build it beside conveyor (scripts/build.sh programs builds both) or copy it there");
}

}  // namespace

ReferenceTrainer TrainInTorchBinary(char** argv) {
  return [argv](const v1::JobSpec&, const ReferenceOptions&) -> StatusOr<v1::JobStatus> {
    return ExecTorchBinary(argv);
  };
}

CheckpointExporter ExportInTorchBinary(char** argv) {
  return [argv](const CheckpointExportOptions&) -> StatusOr<CheckpointExportSummary> {
    return ExecTorchBinary(argv);
  };
}

}  // namespace conveyor::cli
