// `conveyor local`: a whole cluster on this machine for one job (stage
// servers, one per GPU or the job's stages on the CPU, and a coordinator),
// the job followed to its end, what it leaves written or kept, and the
// cluster stopped.
#pragma once

#include <string>

#include "cli/client.h"

namespace conveyor::cli {

int CmdLocal(const Common& c, const std::string& file, int stages, const std::string& device,
             const std::string& trace_prefix, const std::string& profile_dir, bool keep_logs, std::string curves);

}  // namespace conveyor::cli
