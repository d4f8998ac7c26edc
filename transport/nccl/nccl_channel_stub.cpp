// NcclChannel where this build has no NCCL (see nccl_channel.h).
#include "transport/nccl/nccl_channel.h"

namespace conveyor {

bool NcclBuilt() { return false; }

StatusOr<std::string> NewNcclUniqueId() {
  return absl::FailedPreconditionError("this stage server was built without NCCL");
}

StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Join(const std::string&, int, const at::Device&, int, std::string label) {
  return absl::FailedPreconditionError(label + ": this stage server was built without NCCL");
}

}  // namespace conveyor
