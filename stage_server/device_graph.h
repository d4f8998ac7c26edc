// A CUDA graph: the kernels that some work launches on the device, recorded
// once and then launched again, all of them, by one call. A stage whose
// micro-batches are small spends more time launching kernels than the GPU
// spends running them (W1: hundreds of kernels of a few microseconds each);
// replayed, the same work costs the host one launch.
//
// Built with CUDA only (device_graph_cuda.cpp); elsewhere Create() gives null.
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <memory>

#include "common/status.h"

namespace conveyor {

// Thread-compatible: the stage's executor thread.
class DeviceGraph {
 public:
  // Null where `device` has no graphs (the CPU, or a build without CUDA).
  static std::unique_ptr<DeviceGraph> Create(const at::Device& device);
  virtual ~DeviceGraph() = default;

  // Records what `work` launches on the device, from a stream of its own;
  // nothing runs. What it allocates comes from a memory pool private to this
  // graph (shared with `share`'s, when given: for graphs always replayed in
  // the order they were captured) and stays its own for every replay.
  // Work the host must wait for (an item(), a shape read off the device)
  // cannot be recorded: an error says so. Called once.
  virtual Status Capture(const std::function<void()>& work, const DeviceGraph* share = nullptr) = 0;
  // Launches the recorded work on the device's current stream.
  virtual void Replay() = 0;
};

}  // namespace conveyor
