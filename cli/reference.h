// The correctness reference: the whole model in one process on one device, the
// full mini-batch per step, a plain training loop. No stage, schedule or
// transport code; it shares only model construction, data and the loss and
// optimizer arithmetic with the pipeline.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor::cli {

struct ReferenceOptions {
  std::string device = "cpu";
  // Called after every step with the status so far (state RUNNING).
  std::function<void(const v1::JobStatus&)> progress;
  // Where the job's profile_step writes its trace.
  std::string profile_dir = ".";
};

struct ReferenceResult {
  v1::JobStatus status;  // the same fields a pipelined job reports
  std::vector<std::pair<std::string, at::Tensor>> parameters;  // final, model order, on the CPU
  std::vector<std::pair<std::string, at::Tensor>> buffers;     // likewise
};

StatusOr<ReferenceResult> TrainReference(const v1::JobSpec& spec, const ReferenceOptions& options);

}  // namespace conveyor::cli
