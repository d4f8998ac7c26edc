// The `conveyor` command line: submit, status, list, cancel, train
// --reference, local, trace, health, export.
#pragma once

#include "cli/reference_options.h"

namespace conveyor::cli {

// Parses the command line and runs the command; returns the exit code.
// `train --reference` runs `train_reference` (RunReference in the binary):
// passed in so that this library stays torch-free.
int Main(int argc, char** argv, const ReferenceTrainer& train_reference);

}  // namespace conveyor::cli
