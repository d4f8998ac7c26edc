// The correctness reference: the whole model in one process on one device, the
// full mini-batch per step, a plain training loop. No stage, schedule or
// transport code; it shares only model construction, data and the loss and
// optimizer arithmetic with the pipeline.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "cli/reference_options.h"
#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor::cli {

struct ReferenceResult {
  v1::JobStatus status;  // the same fields a pipelined job reports
  std::vector<std::pair<std::string, at::Tensor>> parameters;  // final, model order, on the CPU
  std::vector<std::pair<std::string, at::Tensor>> buffers;     // likewise
  int64_t graphed_steps = 0;  // replayed as CUDA graphs (cuda_graphs)
};

StatusOr<ReferenceResult> TrainReference(const v1::JobSpec& spec, const ReferenceOptions& options);

}  // namespace conveyor::cli
