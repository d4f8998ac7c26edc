// Device work launched on a stream of its own, for the compute stream to join
// later: a batch's host-to-device copy (and its conversions) overlaps the
// step already queued instead of following it. Torch-light header.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <vector>

namespace conveyor {

// What RunOnSideStream queued, for the compute stream to wait on.
class SideStreamWork {
 public:
  virtual ~SideStreamWork() = default;
  // Makes the calling thread's current stream on the device wait for the
  // work, and records `tensors` (made by it) as used there, so that the
  // caching allocator reuses their memory only once that stream is done.
  virtual void Join(const std::vector<at::Tensor>& tensors) = 0;
};

// Runs `fn`, which launches device work, with the process's side stream of
// `device` (one per device) current on this thread (any thread), and returns
// what joins it. Where the
// device is not CUDA, or this build has none, `fn` runs as it is and the
// result is null: its work is ordered on the current stream already.
std::unique_ptr<SideStreamWork> RunOnSideStream(const at::Device& device, const std::function<void()>& fn);

}  // namespace conveyor
