// DeviceGraph with LibTorch's CUDAGraph (see device_graph.h).
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/version.h>

#include <utility>

#include "model/out_of_memory.h"
#include "stage_server/device_graph.h"

namespace conveyor {
namespace {

// The pool id's type moved between LibTorch versions; the graph names it.
using PoolId = decltype(std::declval<at::cuda::CUDAGraph&>().pool());

class CudaGraph final : public DeviceGraph {
 public:
  explicit CudaGraph(c10::DeviceIndex device) : device_(device) {}

  Status Capture(const std::function<void()>& work, const DeviceGraph* share) override {
    c10::cuda::CUDAGuard guard(device_);
    // Capture needs a stream other than the default one; it starts after
    // what the current stream has queued, as a replay there will.
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_);
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_);
    at::cuda::CUDAEvent queued;
    queued.record(current);
    queued.block(side);
    c10::cuda::CUDAStreamGuard on_side(side);
    const PoolId pool = share ? static_cast<const CudaGraph*>(share)->pool_ : PoolId{0, 0};
    try {
#if TORCH_VERSION_MAJOR >= 2
      // Thread-local: the NCCL links' threads go on querying their events
      // meanwhile, which a global capture would forbid them.
      graph_.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
#else
      graph_.capture_begin(pool);
#endif
    } catch (const c10::Error& e) {
      return absl::InternalError(std::string("cannot start a CUDA graph capture: ") + e.what_without_backtrace());
    }
    try {
      work();
    } catch (const c10::Error& e) {
      // End the capture (and the allocator's capture pool) before reporting.
      try {
        graph_.capture_end();
      } catch (const c10::Error&) {
      }
      return TorchErrorStatus(e, absl::StatusCode::kFailedPrecondition, "cannot be captured as a CUDA graph");
    }
    try {
      graph_.capture_end();
    } catch (const c10::Error& e) {
      return absl::FailedPreconditionError(std::string("cannot be captured as a CUDA graph: ") +
                                           e.what_without_backtrace());
    }
    pool_ = graph_.pool();
    captured_ = true;
    return absl::OkStatus();
  }

  void Replay() override {
    TORCH_CHECK(captured_, "replay of a CUDA graph that was not captured");
    c10::cuda::CUDAGuard guard(device_);
    graph_.replay();
  }

 private:
  const c10::DeviceIndex device_;
  at::cuda::CUDAGraph graph_;
  PoolId pool_{0, 0};
  bool captured_ = false;
};

}  // namespace

std::unique_ptr<DeviceGraph> DeviceGraph::Create(const at::Device& device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_unique<CudaGraph>(device.has_index() ? device.index() : c10::cuda::current_device());
}

}  // namespace conveyor
