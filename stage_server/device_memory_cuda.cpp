// What LibTorch's CUDA caching allocator holds reserved on a device (the
// memory this process took from the GPU), for conveyor_stage_device_memory_bytes
// and out-of-memory answers; and emptying its cache after one.
#include "stage_server/device_memory.h"

#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdint>
#include <string>

namespace conveyor {

int64_t CudaReservedBytes(const std::string& device) {
  try {
    const auto colon = device.find(':');
    const int index = colon == std::string::npos ? 0 : std::stoi(device.substr(colon + 1));
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    // Element 0 is StatType::AGGREGATE in LibTorch 1.13 and 2.x alike.
    return stats.reserved_bytes[0].current;
  } catch (const std::exception&) {
    return -1;
  }
}

void EmptyCudaCache() {
  try {
    c10::cuda::CUDACachingAllocator::emptyCache();
  } catch (const std::exception&) {
  }
}

}  // namespace conveyor
