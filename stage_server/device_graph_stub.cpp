// DeviceGraph where this build has no CUDA (see device_graph.h).
#include "stage_server/device_graph.h"

namespace conveyor {

std::unique_ptr<DeviceGraph> DeviceGraph::Create(const at::Device&) { return nullptr; }

}  // namespace conveyor
