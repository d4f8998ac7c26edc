// `conveyor export`: a job's weights, gathered by the CLI straight from the
// stage servers that hold them, written to a file on the CLI's own host.
#pragma once

#include <string>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor::cli {

// What ExportWeights wrote.
struct ExportSummary {
  int stages = 0;
  int64_t tensors = 0;  // parameters and buffers
  int64_t bytes = 0;    // of tensor data
};

// Whether `job` trained to its end and failed writing save.path: its stages
// then keep its weights (until their next job) for ExportWeights.
bool WeightsKept(const v1::JobStatus& job);

// Calls StageControl.GetParameters on every stage that `job` lists
// (status.stages(i).address(), in stage order; each in replies of at most
// kParameterPageBytes, common/wire.h) and writes the parameters and buffers
// to `path` as one state_dict (WriteWireStateDict: what
// torch.load(path, weights_only=True) reads); with `format` "torchscript",
// the job's TorchScript archive with them, which the first stage builds
// (StageControl.ExportTorchScript: INVALID_ARGUMENT for a zoo model) and
// this process writes. A job's weights stay on its
// stages after it succeeded, until the next job runs; a failed or cancelled
// job's are dropped at once (but for WeightsKept). Errors: FAILED_PRECONDITION
// for a job that never started, or that failed or was cancelled, or whose stages no longer hold
// it (another job ran since: the message says to use `save:`); UNAVAILABLE
// naming a stage that does not answer; the writer's errors naming `path`.
// A running job is read stage by stage, each between two of its own steps:
// the parts may then come from neighbouring steps.
// Blocks for up to `deadline_s` per stage; thread-compatible.
StatusOr<ExportSummary> ExportWeights(const v1::JobStatus& job, const std::string& path,
                                      const std::string& format = "state_dict", double deadline_s = 300);

}  // namespace conveyor::cli
