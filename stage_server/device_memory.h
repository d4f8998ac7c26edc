// A GPU's memory as LibTorch's CUDA caching allocator sees it
// (device_memory_cuda.cpp; device_memory_stub.cpp in a build without CUDA).
#pragma once

#include <cstdint>
#include <string>

namespace conveyor {

// Bytes the caching allocator holds reserved on `device` ("cuda:1"); -1
// where it cannot say (no CUDA).
int64_t CudaReservedBytes(const std::string& device);

// Gives the blocks the caching allocator keeps but nothing uses back to the
// devices (torch.cuda.empty_cache()); nothing without CUDA.
void EmptyCudaCache();

}  // namespace conveyor
