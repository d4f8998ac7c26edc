// DeviceClock where this build has no CUDA (see device_clock.h).
#include "stage_server/device_clock.h"

namespace conveyor {

std::unique_ptr<DeviceClock> DeviceClock::Create(const at::Device&) { return nullptr; }

}  // namespace conveyor
