// The `conveyor` command line: submit, status, list, cancel, train
// --reference, local, trace, health, export.
#pragma once

#include "cli/checkpoint_export.h"
#include "cli/reference_options.h"

namespace conveyor::cli {

// Parses the command line and runs the command; returns the exit code.
// `train --reference` runs `train_reference` (RunReference in the binary):
// passed in so that this library stays torch-free; so is `export
// --checkpoint-dir`'s `export_checkpoints` (ExportCheckpoints in the binary).
int Main(int argc, char** argv, const ReferenceTrainer& train_reference,
         const CheckpointExporter& export_checkpoints);

}  // namespace conveyor::cli
