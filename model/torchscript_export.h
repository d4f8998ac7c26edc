// A TorchScript model with trained weights: the job's archive, its parameters
// and buffers replaced by the weights gathered from the stages, for
// `save: {format: torchscript}` and `conveyor export --format torchscript`.
#pragma once

#include <string>

#include "model/partition.h"

namespace conveyor {

// Loads the archive at `path` (on the CPU), copies `weights` (named as the
// whole model's state_dict() names them) into its parameters and buffers,
// and returns the archive's bytes as torch.jit.load reads them. A job trained
// in bf16 gives a bf16 archive. INVALID_ARGUMENT for a file that is not
// TorchScript, a parameter or buffer of the archive missing from `weights`,
// a weight the archive lacks, or one whose shape differs (each named).
// NOT_FOUND for a missing file.
StatusOr<std::string> TorchScriptWithWeights(const std::string& path, const NamedTensors& weights);

// Writes `weights` to `path` atomically: a state_dict (model/state_dict.h),
// or with `torchscript` the archive of `model` with them
// (TorchScriptWithWeights; INVALID_ARGUMENT for a zoo model). Errors name
// `key` (the option or job key the path came from).
Status WriteWeights(const std::string& path, const NamedTensors& weights, const v1::ModelSpec& model,
                    bool torchscript, const std::string& key);

}  // namespace conveyor
