// When a stage's work ran on its device, not when the host queued it: events
// recorded on the device's current stream, read once the step's work is done.
// On a GPU the host runs ahead of the device, so host times show launch cost
// and waits, not the kernels; the stage's timeline uses these instead.
//
// The host may launch a step while the device still works on the one before
// (two steps in flight), so a step's first mark is not "now" on the host's
// clock: every mark is timed from an anchor, an event recorded when the
// device had nothing queued, whose host time is known.
//
// Built with CUDA only (device_clock_cuda.cpp); elsewhere Create() gives null
// and the stage keeps host times (on the CPU they are the work's own).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace conveyor {

// Thread-compatible: Begin() on the stage's executor thread.
class DeviceClock {
 public:
  // One step's marks. Mark() on the thread that launches the step; Passed()
  // and HostUs() on any one thread after that (the one that waits for it).
  class Marks {
   public:
    virtual ~Marks() = default;
    // Records a mark now on the device's current stream; its index.
    virtual int Mark() = 0;
    // How many marks, from the first, the device has passed so far (never
    // waits): progress, for a host that waits for a long queue of work.
    virtual int Passed() = 0;
    // Once the device has done everything marked: each mark's time on the
    // host's clock (the timeline's: microseconds since the Unix epoch).
    virtual std::vector<int64_t> HostUs() = 0;
  };

  // Null where `device` has no events to time with (the CPU, or no CUDA).
  static std::unique_ptr<DeviceClock> Create(const at::Device& device);
  virtual ~DeviceClock() = default;

  // A new step's marks, mark 0 recorded now. `device_idle`: nothing is
  // queued on the device (the steps before were waited for), so its time is
  // the host's now: the anchor is taken again.
  virtual std::shared_ptr<Marks> Begin(bool device_idle) = 0;
};

}  // namespace conveyor
