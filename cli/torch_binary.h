// The two commands that need LibTorch, `train --reference` and `export
// --checkpoint-dir`, run in conveyor-torch: the same command line linked with
// LibTorch (cli/conveyor_torch_main.cpp). `conveyor` itself is linked without
// it, so that every other command starts in milliseconds: Debian's LibTorch
// loads 337 libraries and registers its operators in every process that links
// it, about 0.9 s of CPU on a 2-core machine.
#pragma once

#include "cli/checkpoint_export.h"
#include "cli/reference_options.h"

namespace conveyor::cli {

// A trainer and an exporter that replace this process by conveyor-torch,
// from this program's folder, with the same arguments (`argv`, which must
// outlive them). Each returns only if that fails: FAILED_PRECONDITION naming
// the missing program and how to build it.
ReferenceTrainer TrainInTorchBinary(char** argv);
CheckpointExporter ExportInTorchBinary(char** argv);

}  // namespace conveyor::cli
