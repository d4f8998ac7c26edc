// A build without CUDA: no GPU memory to report or free.
#include "stage_server/device_memory.h"

namespace conveyor {

int64_t CudaReservedBytes(const std::string&) { return -1; }
void EmptyCudaCache() {}

}  // namespace conveyor
