// The stage servers' data plane: one long-lived chunked stream
// (StageData.PushChunks) to each neighbour, fed by a sender thread so Send()
// never blocks the stage. The stream carries every frame's header, and its
// bytes too unless the link was set up for NCCL: then the bytes go over the
// link's NCCL communicator of their direction (nccl_channel.h) in the order
// of the headers, and a receiving thread per NCCL link fetches them.
#pragma once

#include "transport/transport.h"

namespace conveyor {

class GrpcTransportFactory : public TransportFactory {
 public:
  StatusOr<std::unique_ptr<Transport>> Connect(const v1::StageAssignment& assignment, const LinkOptions& options,
                                               std::chrono::steady_clock::time_point deadline) override;
  bool SupportsNccl() const override;
  // An NCCL link's ids, and the shared memory for its headers (made here,
  // before the downstream stage attaches to it when it connects).
  StatusOr<v1::LinkSetup> PrepareLink(const std::string& device, const NcclOptions& nccl,
                                      std::shared_ptr<PreparedLink>* prepared) override;
};

}  // namespace conveyor
