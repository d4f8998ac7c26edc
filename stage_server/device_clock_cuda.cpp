// DeviceClock with CUDA events (see device_clock.h).
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <deque>
#include <mutex>

#include "common/clock.h"
#include "stage_server/device_clock.h"

namespace conveyor {
namespace {

// Events with timing, reused step after step (creating one costs the host
// a few microseconds, and a step records tens).
class EventPool {
 public:
  std::deque<at::cuda::CUDAEvent> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return {};
    std::deque<at::cuda::CUDAEvent> events = std::move(free_.back());
    free_.pop_back();
    return events;
  }
  void Give(std::deque<at::cuda::CUDAEvent> events) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < 4) free_.push_back(std::move(events));
  }

 private:
  std::mutex mu_;
  std::vector<std::deque<at::cuda::CUDAEvent>> free_;
};

struct Anchor {
  at::cuda::CUDAEvent event{cudaEventDefault};
  int64_t host_us = 0;
};

class CudaMarks final : public DeviceClock::Marks {
 public:
  CudaMarks(c10::DeviceIndex device, std::shared_ptr<Anchor> anchor, std::shared_ptr<EventPool> pool)
      : device_(device), anchor_(std::move(anchor)), pool_(std::move(pool)), events_(pool_->Take()) {}
  ~CudaMarks() override { pool_->Give(std::move(events_)); }

  int Mark() override {
    if (used_ == events_.size()) events_.emplace_back(cudaEventDefault);  // with timing
    events_[used_].record(c10::cuda::getCurrentCUDAStream(device_));
    return static_cast<int>(used_++);
  }

  int Passed() override {
    while (passed_ < used_ && events_[passed_].query()) ++passed_;
    return static_cast<int>(passed_);
  }

  std::vector<int64_t> HostUs() override {
    std::vector<int64_t> us;
    for (std::size_t i = 0; i < used_; ++i) {
      const double ms = static_cast<double>(anchor_->event.elapsed_time(events_[i]));
      us.push_back(anchor_->host_us + static_cast<int64_t>(1000.0 * ms));
    }
    return us;
  }

 private:
  const c10::DeviceIndex device_;
  const std::shared_ptr<Anchor> anchor_;
  const std::shared_ptr<EventPool> pool_;
  std::deque<at::cuda::CUDAEvent> events_;
  std::size_t used_ = 0;
  std::size_t passed_ = 0;  // marks known passed, of used_
};

class CudaClock final : public DeviceClock {
 public:
  explicit CudaClock(c10::DeviceIndex device) : device_(device), pool_(std::make_shared<EventPool>()) {}

  std::shared_ptr<Marks> Begin(bool device_idle) override {
    if (device_idle || !anchor_) {
      auto anchor = std::make_shared<Anchor>();
      anchor->event.record(c10::cuda::getCurrentCUDAStream(device_));
      anchor->host_us = UnixMicros();
      anchor_ = std::move(anchor);
    }
    auto marks = std::make_shared<CudaMarks>(device_, anchor_, pool_);
    marks->Mark();
    return marks;
  }

 private:
  const c10::DeviceIndex device_;
  const std::shared_ptr<EventPool> pool_;
  std::shared_ptr<Anchor> anchor_;  // the last time the device was idle
};

}  // namespace

std::unique_ptr<DeviceClock> DeviceClock::Create(const at::Device& device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_unique<CudaClock>(device.has_index() ? device.index() : c10::cuda::current_device());
}

}  // namespace conveyor
