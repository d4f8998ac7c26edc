// cli/: the `conveyor` program, what a user types. It talks to a coordinator
// (submit, status, list, cancel, resume), runs a whole cluster on this machine
// for one job (local), trains the one-process reference every pipelined run
// must equal (train --reference), and works on a job's results (trace, plot,
// export) and on what surrounds it (health, keys). Torch-free but for
// conveyor_reference, which the binary passes in (below).
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
