// DeviceClock with CUDA events (see device_clock.h).
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <deque>

#include "stage_server/device_clock.h"

namespace conveyor {
namespace {

class CudaClock final : public DeviceClock {
 public:
  explicit CudaClock(c10::DeviceIndex device) : device_(device) {}

  void Begin() override {
    used_ = 0;
    passed_ = 0;
    Mark();
  }

  int Passed() override {
    while (passed_ < used_ && events_[passed_].query()) ++passed_;
    return static_cast<int>(passed_);
  }

  int Mark() override {
    if (used_ == events_.size()) events_.emplace_back(cudaEventDefault);  // with timing
    events_[used_].record(c10::cuda::getCurrentCUDAStream(device_));
    return static_cast<int>(used_++);
  }

  std::vector<double> ElapsedUs() override {
    std::vector<double> us;
    for (std::size_t i = 0; i < used_; ++i)
      us.push_back(i == 0 ? 0.0 : 1000.0 * static_cast<double>(events_[0].elapsed_time(events_[i])));
    return us;
  }

 private:
  const c10::DeviceIndex device_;
  std::deque<at::cuda::CUDAEvent> events_;  // reused step after step
  std::size_t used_ = 0;
  std::size_t passed_ = 0;  // marks known passed, of used_
};

}  // namespace

std::unique_ptr<DeviceClock> DeviceClock::Create(const at::Device& device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_unique<CudaClock>(device.has_index() ? device.index() : c10::cuda::current_device());
}

}  // namespace conveyor
