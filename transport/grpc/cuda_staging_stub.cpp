// The staging copies where this build has no CUDA (see cuda_staging.h).
#include "transport/grpc/cuda_staging.h"

namespace conveyor {

StatusOr<std::unique_ptr<DeviceToHostCopy>> DeviceToHostCopy::Start(const at::Tensor&, const c10::Event*, int64_t) {
  return absl::FailedPreconditionError("this build has no CUDA");
}

StatusOr<std::unique_ptr<HostToDeviceCopy>> HostToDeviceCopy::Start(const at::Tensor&) {
  return absl::FailedPreconditionError("this build has no CUDA");
}

}  // namespace conveyor
