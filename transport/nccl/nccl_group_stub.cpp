// NcclGroup where this build has no NCCL (see nccl_group.h).
#include "transport/nccl/nccl_group.h"

namespace conveyor {

StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::Join(const std::string&, int, int, const at::Device&,
                                                     std::chrono::milliseconds, std::string label) {
  return absl::FailedPreconditionError(label + ": this stage server was built without NCCL");
}

}  // namespace conveyor
