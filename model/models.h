// The model zoo: a model is an ordered list of layers; a stage builds the
// contiguous range [begin, end) of it.
//
// Initial weights never depend on the partition: every layer draws its
// parameters from its own generator, seeded from (job seed, layer index), so
// 1-, 2- and 4-stage runs and the reference all start equal.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

// Builds layers [begin, end) on the CPU, in the job's precision.
// INVALID_ARGUMENT for a bad range or an unknown model. `init` false skips the
// seeded initialisation (for probing shapes and timing, where values do not
// matter and initialising a large model costs seconds).
StatusOr<torch::nn::Sequential> BuildLayers(const v1::JobSpec& spec, int begin, int end, bool init = true);


}  // namespace conveyor
