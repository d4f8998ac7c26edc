// What only a CUDA build can tell about a device: device_info_cuda.cpp in
// CUDA builds, device_info_stub.cpp (nothing known) elsewhere. `device` is a
// LibTorch device string ("cuda", "cuda:1").
#pragma once

#include <cstdint>
#include <string>

namespace conveyor {

// What LibTorch's CUDA caching allocator holds reserved on `device` (the
// memory this process took from the GPU); -1 where unknown.
int64_t CudaReservedBytes(const std::string& device);

// The device's UUID as nvidia-smi prints it ("GPU-8f0c3c0e-..."); "" where
// unknown. It names the physical GPU whatever CUDA_VISIBLE_DEVICES numbers it.
std::string CudaDeviceUuid(const std::string& device);

// The caching allocator's peak of allocated bytes on `device` since the last
// ResetCudaPeak (or the start); -1 where unknown.
int64_t CudaPeakAllocatedBytes(const std::string& device);
void ResetCudaPeak(const std::string& device);

// Gives the blocks the caching allocator keeps but nothing uses back to the
// devices (torch.cuda.empty_cache()); nothing without CUDA.
void EmptyCudaCache();

}  // namespace conveyor
