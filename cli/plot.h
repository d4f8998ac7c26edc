// Pictures drawn by the project's matplotlib scripts (cli/*.py): finding the
// script and a python3 that can import matplotlib, and running it.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace conveyor::cli {

// Runs cli/`script` (or the file in $`env_override` when set) with `args`
// under the first of $CONVEYOR_PYTHON, python3 and /usr/bin/python3 that can
// import matplotlib. NOT_FOUND when the script is missing, FAILED_PRECONDITION
// when no python3 has matplotlib (the message says what to install), INTERNAL
// when the script failed.
Status RunPlotScript(const std::string& script, const char* env_override, const std::vector<std::string>& args);

}  // namespace conveyor::cli
