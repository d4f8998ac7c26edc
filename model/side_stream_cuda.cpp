// RunOnSideStream with CUDA streams and events (see side_stream.h).
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <mutex>

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
  // One side stream per device for the process, not the pool's next one each
  // time: the caching allocator keeps freed blocks per stream, so batches
  // made on up to 32 pool streams in turn would each keep a batch's memory.
  using Streams = std::map<c10::DeviceIndex, c10::cuda::CUDAStream>;
  static std::mutex mu;
  static Streams* streams = new Streams;  // never destroyed: streams outlive every loader
  const c10::cuda::CUDAStream side = [&] {
    std::lock_guard<std::mutex> lock(mu);
    auto it = streams->find(index);
    if (it == streams->end())
      it = streams->emplace(index, c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)).first;
    return it->second;
  }();
  {
    c10::cuda::CUDAStreamGuard guard(side);  // sets the device too
    fn();
  }
  return std::make_unique<CudaSideWork>(index, side);
}

}  // namespace conveyor
