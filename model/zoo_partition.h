// The built-in zoo's layers (model/models.h) behind the Partition seam.
#pragma once

#include <memory>

#include "model/partition.h"
#include "conveyor.pb.h"

namespace conveyor {

// Layers [begin, end) of the job's zoo model, built on the CPU in the job's
// precision (see BuildLayers: `init` false skips the seeded initialisation).
StatusOr<std::unique_ptr<Partition>> BuildZooPartition(const v1::JobSpec& spec, int begin, int end, bool init = true);

}  // namespace conveyor
