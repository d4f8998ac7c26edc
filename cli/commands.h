// The `conveyor` command line: submit, status, list, cancel, train
// --reference, local, health.
#pragma once

namespace conveyor::cli {

// Parses the command line and runs the command; returns the exit code.
int Main(int argc, char** argv);

}  // namespace conveyor::cli
