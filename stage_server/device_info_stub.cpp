// A build without CUDA: nothing to tell about a GPU.
#include "stage_server/device_info.h"

namespace conveyor {

int64_t CudaReservedBytes(const std::string&) { return -1; }

std::string CudaDeviceUuid(const std::string&) { return ""; }

void EmptyCudaCache() {}

int64_t CudaPeakAllocatedBytes(const std::string&) { return -1; }

void ResetCudaPeak(const std::string&) {}

}  // namespace conveyor
