// `conveyor export --checkpoint-dir DIR ...`: a job's weights from the
// checkpoint files its stage servers wrote, without a running cluster. The
// declarations are torch-free (cli::Main takes the exporter as it takes the
// ReferenceTrainer); ExportCheckpoints reads LibTorch archives and is defined
// in the conveyor_reference target (cli/checkpoint_export.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace conveyor::cli {

struct CheckpointExportOptions {
  std::vector<std::string> dirs;     // each stage server's --checkpoint-dir
  std::string job_id;                // "": the one job that the folders hold
  int64_t step = 0;                  // 0: the newest step checkpointed on every stage
  std::string out;                   // the file to write
  std::string format = "state_dict"; // or "torchscript"
};

struct CheckpointExportSummary {
  std::string job_id;
  int64_t step = 0;
  int stages = 0;
  int64_t tensors = 0;  // parameters and buffers
  int64_t bytes = 0;    // of tensor data
};

using CheckpointExporter = std::function<StatusOr<CheckpointExportSummary>(const CheckpointExportOptions&)>;

// Finds the job's checkpoints under `dirs` (<dir>/<job>/stage-<s>/step-N.ckpt,
// stage_server/checkpoint.h), checks that together they hold every stage of
// one job, spec and step, reads each stage's parameters and buffers and
// writes them to `out` under the names of the model's state_dict(), in stage
// order (what `conveyor export JOB` writes), or (format torchscript) the
// job's archive with them. Errors, each naming the folders or files:
// NOT_FOUND for a missing folder, a job or step without checkpoints, a stage
// whose checkpoints no folder holds; INVALID_ARGUMENT for folders holding
// several jobs without --job, a stage found in two folders, torchscript for a
// zoo model; FAILED_PRECONDITION for stages whose checkpoints come from
// different job specs or partitions (a layer missing or present twice), no
// step common to every stage, a checkpoint written before checkpoints carried
// names; DATA_LOSS for a corrupt file.
StatusOr<CheckpointExportSummary> ExportCheckpoints(const CheckpointExportOptions& options);

}  // namespace conveyor::cli
