// What a CUDA build can tell about a device: the caching allocator's reserve
// (for conveyor_stage_device_memory_bytes and out-of-memory answers), emptying
// its cache after one, and the GPU's UUID (StageInfo).
#include "stage_server/device_info.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <cstdio>

namespace conveyor {
namespace {

int DeviceIndex(const std::string& device) {
  const auto colon = device.find(':');
  return colon == std::string::npos ? 0 : std::stoi(device.substr(colon + 1));
}

}  // namespace

int64_t CudaReservedBytes(const std::string& device) {
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(DeviceIndex(device));
    // Element 0 is StatType::AGGREGATE in LibTorch 1.13 and 2.x alike.
    return stats.reserved_bytes[0].current;
  } catch (const std::exception&) {
    return -1;
  }
}

int64_t CudaPeakAllocatedBytes(const std::string& device) {
  try {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(DeviceIndex(device)).allocated_bytes[0].peak;
  } catch (const std::exception&) {
    return -1;
  }
}

void ResetCudaPeak(const std::string& device) {
  try {
    c10::cuda::CUDACachingAllocator::resetPeakStats(DeviceIndex(device));
  } catch (const std::exception&) {
  }
}

void EmptyCudaCache() {
  try {
    c10::cuda::CUDACachingAllocator::emptyCache();
  } catch (const std::exception&) {
  }
}

std::string CudaDeviceUuid(const std::string& device) {
  int index = 0;
  try {
    index = DeviceIndex(device);
  } catch (const std::exception&) {
    return "";
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for the next CUDA call
    return "";
  }
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  char out[48];
  std::snprintf(out, sizeof(out), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

}  // namespace conveyor
