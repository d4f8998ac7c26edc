// The gRPC data plane: one long-lived client stream (StageData.Push) to each
// neighbour, fed by a sender thread so Send() never blocks the stage.
#pragma once

#include "stage_server/transport.h"

namespace conveyor {

class GrpcTransportFactory : public TransportFactory {
 public:
  StatusOr<std::unique_ptr<Transport>> Connect(const v1::StageAssignment& assignment,
                                               std::chrono::steady_clock::time_point deadline) override;
};

}  // namespace conveyor
