// RunOnSideStream with CUDA streams and events (see side_stream.h).
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "model/side_stream.h"

namespace conveyor {
namespace {

class CudaSideWork final : public SideStreamWork {
 public:
  CudaSideWork(c10::DeviceIndex device, const c10::cuda::CUDAStream& side) : device_(device) { done_.record(side); }

  void Join(const std::vector<at::Tensor>& tensors) override {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_);
    done_.block(current);
    for (const at::Tensor& t : tensors) {
      if (t.defined() && t.is_cuda()) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), current);
    }
  }

 private:
  const c10::DeviceIndex device_;
  at::cuda::CUDAEvent done_;
};

}  // namespace

std::unique_ptr<SideStreamWork> RunOnSideStream(const at::Device& device, const std::function<void()>& fn) {
  if (!device.is_cuda()) {
    fn();
    return nullptr;
  }
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
  {
    c10::cuda::CUDAStreamGuard guard(side);  // sets the device too
    fn();
  }
  return std::make_unique<CudaSideWork>(index, side);
}

}  // namespace conveyor
