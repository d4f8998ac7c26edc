// The staging copies on CUDA (see cuda_staging.h).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "transport/grpc/cuda_staging.h"

namespace conveyor {
namespace {

Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string(what) + ": " + cudaGetErrorString(e));
}

at::Tensor Pinned(int64_t bytes) {
  return at::empty({std::max<int64_t>(bytes, 1)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
}

class DeviceToHostImpl final : public DeviceToHostCopy {
 public:
  DeviceToHostImpl(const at::Tensor& src, int64_t piece)
      : src_(src), piece_(piece), bytes_(src.numel() * src.element_size()),
        stream_(c10::cuda::getStreamFromPool(false, src.device().index())), host_(Pinned(bytes_)) {}

  Status Begin(const c10::Event* ready) {
    c10::cuda::CUDAGuard guard(src_.device().index());
    if (ready) ready->block(stream_.unwrap());
    const char* from = static_cast<const char*>(src_.data_ptr());
    char* to = static_cast<char*>(host_.data_ptr());
    const int pieces = static_cast<int>((bytes_ + piece_ - 1) / piece_);
    events_.resize(pieces);
    for (int i = 0; i < pieces; ++i) {
      const int64_t off = i * piece_, n = std::min(piece_, bytes_ - off);
      CONVEYOR_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyAsync(to + off, from + off, static_cast<size_t>(n), cudaMemcpyDeviceToHost, stream_.stream()),
          "copying a tensor to the host"));
      events_[i].record(stream_);
    }
    return absl::OkStatus();
  }
  Status Wait(int i) override {
    c10::cuda::CUDAGuard guard(src_.device().index());
    events_.at(i).synchronize();
    if (i + 1 == static_cast<int>(events_.size())) src_ = at::Tensor();  // every copy is done
    return absl::OkStatus();
  }
  const char* host() const override { return static_cast<const char*>(host_.data_ptr()); }

 private:
  at::Tensor src_;  // kept until its bytes are copied
  const int64_t piece_, bytes_;
  c10::cuda::CUDAStream stream_;
  at::Tensor host_;
  std::vector<at::cuda::CUDAEvent> events_;
};

class HostToDeviceImpl final : public HostToDeviceCopy {
 public:
  explicit HostToDeviceImpl(const at::Tensor& dst)
      : dst_(dst), stream_(c10::cuda::getStreamFromPool(false, dst.device().index())),
        host_(Pinned(dst.numel() * dst.element_size())) {
    // `dst` came from the caching allocator on the current stream, which may
    // still have kernels queued that read its block's old contents: the
    // copies on our stream wait for them.
    c10::cuda::CUDAGuard guard(dst.device().index());
    at::cuda::CUDAEvent allocated;
    allocated.record(c10::cuda::getCurrentCUDAStream(dst.device().index()));
    allocated.block(stream_);
  }

  char* host() override { return static_cast<char*>(host_.data_ptr()); }
  Status Commit(int64_t offset, int64_t n) override {
    c10::cuda::CUDAGuard guard(dst_.device().index());
    return CudaStatus(cudaMemcpyAsync(static_cast<char*>(dst_.data_ptr()) + offset, host() + offset,
                                      static_cast<size_t>(n), cudaMemcpyHostToDevice, stream_.stream()),
                      "copying a tensor to the device");
  }
  Status Finish() override {
    c10::cuda::CUDAGuard guard(dst_.device().index());
    return CudaStatus(cudaStreamSynchronize(stream_.stream()), "copying a tensor to the device");
  }

 private:
  at::Tensor dst_;
  c10::cuda::CUDAStream stream_;
  at::Tensor host_;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceToHostCopy>> DeviceToHostCopy::Start(const at::Tensor& src, const c10::Event* ready,
                                                                    int64_t piece) {
  auto copy = std::make_unique<DeviceToHostImpl>(src, piece);
  CONVEYOR_RETURN_IF_ERROR(copy->Begin(ready));
  return std::unique_ptr<DeviceToHostCopy>(std::move(copy));
}

StatusOr<std::unique_ptr<HostToDeviceCopy>> HostToDeviceCopy::Start(const at::Tensor& dst) {
  return std::unique_ptr<HostToDeviceCopy>(std::make_unique<HostToDeviceImpl>(dst));
}

}  // namespace conveyor
