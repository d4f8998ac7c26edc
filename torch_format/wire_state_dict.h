// The parameters the stages sent on the wire (conveyor.v1.ParametersReply),
// written as a state_dict file: torch-free, with torch_file.h's writer. The
// coordinator (save.path) and `conveyor export` write with it.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

// Writes the parameters and buffers that the stages sent (GetParameters, one
// reply per stage in stage order) as a state_dict file that
// torch.load(path, weights_only=True) reads and load_state_dict accepts: the
// names are the model's state_dict() names; each stage's parameters come
// before its buffers.
Status WriteWireStateDict(const std::string& path, const std::vector<v1::ParametersReply>& parts);

}  // namespace conveyor
