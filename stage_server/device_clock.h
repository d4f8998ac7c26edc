// When a stage's work ran on its device, not when the host queued it: events
// recorded on the device's current stream, read once the step's work is done.
// On a GPU the host runs ahead of the device, so host times show launch cost
// and waits, not the kernels; the stage's timeline uses these instead.
//
// Built with CUDA only (device_clock_cuda.cpp); elsewhere Create() gives null
// and the stage keeps host times (on the CPU they are the work's own).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <vector>

namespace conveyor {

// Thread-compatible: the stage's executor thread.
class DeviceClock {
 public:
  // Null where `device` has no events to time with (the CPU, or no CUDA).
  static std::unique_ptr<DeviceClock> Create(const at::Device& device);
  virtual ~DeviceClock() = default;

  // Starts a new step: forgets the marks and records mark 0 now.
  virtual void Begin() = 0;
  // Records a mark now on the device's current stream; its index.
  virtual int Mark() = 0;
  // How many marks, from the first, the device has passed so far (never
  // waits): progress, for a host that waits for a long queue of work.
  virtual int Passed() = 0;
  // Once the device has done everything marked: each mark's microseconds
  // after mark 0.
  virtual std::vector<double> ElapsedUs() = 0;
};

}  // namespace conveyor
