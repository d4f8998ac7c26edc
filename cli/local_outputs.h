// Where `conveyor local` puts what a run leaves behind besides its logs: the
// curves picture, and the trained weights when save.path could not take them.
#pragma once

#include <string>

#include "common/status.h"

namespace conveyor::cli {

// The default curves picture of one run, created empty so that no other run
// takes the same name: beside the job's weights when it saves them
// (save.path's name without its extension, then "-curves.png", or
// "-curves-2.png" and on where that exists), else (and where nothing can be
// created there) `run_dir`/curves.png, a run's own folder. Never an existing
// file. An error when neither can be created.
StatusOr<std::string> ReserveCurvesPicture(const std::string& save_path, const std::string& run_dir);

// Where `conveyor local` writes the weights that save.path could not take:
// `run_dir`/ with save.path's file name.
std::string RescuedWeightsPath(const std::string& save_path, const std::string& run_dir);

}  // namespace conveyor::cli
